"""Dataset adapters, each tested on a few made-up rows written in the real dataset's schema."""

from __future__ import annotations

import json

import datasets
import pytest
from datasets import Dataset

from riskpo_trl.data import (
    ADAPTED_COLUMNS,
    BENCHMARKS,
    DAPO_INSTRUCTION_PREFIX,
    DAPO_INSTRUCTION_SUFFIX,
    HARD_MATH_BENCHMARKS,
    PROMPT_TEMPLATE,
    TRAIN_DATASETS,
    DatasetSpec,
    DatasetUnavailableError,
    adapt_dataset,
    load_benchmark,
)
from riskpo_trl.rewards import math_verify_reward, verl_by_source_reward
from riskpo_trl.tracks import load_train_dataset

# One or two rows per source, in the source's own columns (values invented).
RAW_ROWS = {
    ("train", "dapo_math"): [
        {
            "data_source": "math_dapo",
            "prompt": [
                {"role": "user", "content": DAPO_INSTRUCTION_PREFIX + "What is 2+3?" + DAPO_INSTRUCTION_SUFFIX}
            ],
            "ability": "MATH",
            "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": "5"},
            "extra_info": {"index": "a1"},
        },
    ],
    ("train", "math"): [
        {
            "problem": "Compute $1/2 + 0$.",
            "level": "Level 1",
            "type": "Algebra",
            "solution": r"We get $\boxed{\frac{1}{2}}$.",
        },
    ],
    ("train", "gsm8k"): [
        {"question": "Tom has 1,000 apples and buys 200 more. How many?", "answer": "1000+200=1200\n#### 1,200"},
    ],
    ("bench", "aime24"): [
        {"id": 60, "problem": "Find x.", "solution": "... so 204.", "answer": "204", "url": "u", "year": "2024"},
    ],
    ("bench", "aime25"): [{"id": "0", "problem": "Find y.", "answer": "70"}],
    ("bench", "amc"): [
        {"id": 0, "problem": "Find r.", "answer": 142.0, "url": "https://artofproblemsolving.com/wiki/2023_AMC_12A_1"},
    ],
    ("bench", "amc23"): [{"id": 0, "question": "Find z.", "answer": 27.0}],
    ("bench", "math500"): [
        {
            "problem": "Find w.",
            "solution": r"\boxed{3}",
            "answer": "3",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        },
    ],
    ("bench", "minerva"): [{"question": "Find v.", "answer": "0.5"}],
    ("bench", "olympiadbench"): [
        {
            "id": 1606,
            "question": "Find u.",
            "final_answer": ["$2^{1009}$"],
            "solution": ["..."],
            "is_multiple_answer": False,
            "unit": None,
            "answer_type": "Numerical",
        },
    ],
    ("bench", "math"): [
        {"problem": "Find t.", "level": "Level 2", "type": "Algebra", "solution": r"So $\boxed{7}$."},
    ],
    ("bench", "gsm8k"): [{"question": "Find s.", "answer": "3*3=9\n#### 9"}],
}
EXPECTED_ANSWERS = {
    ("train", "dapo_math"): "5",
    ("train", "math"): r"\frac{1}{2}",
    ("train", "gsm8k"): "1200",
    ("bench", "aime24"): "204",
    ("bench", "aime25"): "70",
    ("bench", "amc"): "142",
    ("bench", "amc23"): "27",
    ("bench", "math500"): "3",
    ("bench", "minerva"): "0.5",
    ("bench", "olympiadbench"): "2^{1009}",
    ("bench", "math"): "7",
    ("bench", "gsm8k"): "9",
}


def _spec(kind: str, name: str):
    return (TRAIN_DATASETS if kind == "train" else BENCHMARKS)[name]


def test_every_registered_source_has_schema_rows():
    # Loader entries (code, multi-modal) are covered by tests/test_track_script.py.
    registered = {("train", n) for n, s in TRAIN_DATASETS.items() if isinstance(s, DatasetSpec)}
    registered |= {("bench", n) for n, s in BENCHMARKS.items() if isinstance(s, DatasetSpec)}
    assert registered == set(RAW_ROWS)
    assert set(HARD_MATH_BENCHMARKS) <= set(BENCHMARKS)


@pytest.mark.parametrize(("kind", "name"), sorted(RAW_ROWS))
def test_adapter_maps_real_schema_to_trainer_columns(kind, name):
    adapted = adapt_dataset(Dataset.from_list(RAW_ROWS[(kind, name)]), _spec(kind, name), name)
    assert sorted(adapted.column_names) == sorted(ADAPTED_COLUMNS)
    row = adapted[0]
    assert row["answer"] == EXPECTED_ANSWERS[(kind, name)]
    assert row["solution"] == row["answer"]
    assert row["prompt"] == [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=row["problem"])}]
    assert "\\boxed{}" in row["prompt"][0]["content"]
    assert row["data_source"] == _spec(kind, name).hub_id
    # The gold answers the adapters produce are ones the reward can score.
    completion = [{"role": "assistant", "content": f"\\boxed{{{row['answer']}}}"}]
    assert math_verify_reward([completion], solution=[row["solution"]]) == [1.0]


def test_dapo_problem_loses_dapos_own_instruction():
    adapted = adapt_dataset(Dataset.from_list(RAW_ROWS[("train", "dapo_math")]), TRAIN_DATASETS["dapo_math"])
    assert adapted[0]["problem"] == "What is 2+3?"
    assert "Answer:" not in adapted[0]["prompt"][0]["content"]


# The instruction of the authors' MATH/GSM8K data script (RTkenny/RiskPO data_processing/download_easymath.py), as
# their script writes it: question + " " + instruction.
AUTHORS_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


@pytest.mark.parametrize("name", ["math", "gsm8k"])
def test_authors_prompt_template_appends_their_instruction(name):
    row = RAW_ROWS[("train", name)][0]
    question = row["problem"] if name == "math" else row["question"]
    adapted = adapt_dataset(Dataset.from_list([row]), TRAIN_DATASETS[name], name, "authors")
    assert adapted[0]["prompt"] == [{"role": "user", "content": question + " " + AUTHORS_INSTRUCTION}]
    assert adapted[0]["problem"] == question


def test_authors_prompt_template_keeps_dapos_own_prompt():
    rows = RAW_ROWS[("train", "dapo_math")]
    adapted = adapt_dataset(Dataset.from_list(rows), TRAIN_DATASETS["dapo_math"], "dapo_math", "authors")
    assert adapted[0]["prompt"] == rows[0]["prompt"]  # DAPO's instruction and all
    assert adapted[0]["problem"] == "What is 2+3?" and adapted[0]["solution"] == "5"


def test_prompt_template_reaches_every_part_of_a_mixture(monkeypatch):
    parts = {
        "DigitalLearningGmbH/MATH-lighteval": RAW_ROWS[("train", "math")],
        "openai/gsm8k": RAW_ROWS[("train", "gsm8k")],
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, *args, **kwargs: Dataset.from_list(parts[hub_id]))
    mixture = load_train_dataset("math_gsm8k", prompt_template="authors")
    assert all(prompt[0]["content"].endswith(" " + AUTHORS_INSTRUCTION) for prompt in mixture["prompt"])
    assert sorted(mixture["data_source"]) == sorted(parts)
    # what the authors' pipeline gives a boxed answer to each part: GSM8K's strict grader wants "#### 1200"
    graded = dict(
        zip(
            mixture["data_source"],
            verl_by_source_reward(
                [f"\\boxed{{{answer}}}" for answer in mixture["solution"]], mixture["solution"], mixture["data_source"]
            ),
        )
    )
    assert graded == {"DigitalLearningGmbH/MATH-lighteval": 1.0, "openai/gsm8k": 0.0}


def test_unknown_or_misplaced_prompt_template_is_refused():
    with pytest.raises(ValueError, match=r"prompt_template='author' is unknown.*'authors'"):
        adapt_dataset(Dataset.from_list(RAW_ROWS[("train", "math")]), TRAIN_DATASETS["math"], "math", "author")
    with pytest.raises(ValueError, match="applies to the math datasets; 'archer_code'"):
        load_train_dataset("archer_code", data_files="examples/data/tiny_archer_code.jsonl", prompt_template="authors")


def test_dapo_duplicates_are_dropped():
    rows = RAW_ROWS[("train", "dapo_math")] * 3
    assert len(adapt_dataset(Dataset.from_list(rows), TRAIN_DATASETS["dapo_math"])) == 1


def test_rows_without_gold_answer_are_dropped():
    rows = RAW_ROWS[("train", "math")] + [{"problem": "p", "level": "l", "type": "t", "solution": "no box here"}]
    assert len(adapt_dataset(Dataset.from_list(rows), TRAIN_DATASETS["math"])) == 1


@pytest.mark.parametrize(("kind", "name"), [("train", "gsm8k"), ("bench", "olympiadbench"), ("train", "dapo_math")])
def test_missing_column_is_named(kind, name):
    spec = _spec(kind, name)
    rows = [{k: v for k, v in row.items() if k != spec.answer_column} for row in RAW_ROWS[(kind, name)]]
    with pytest.raises(ValueError, match=f"'{spec.answer_column}'"):
        adapt_dataset(Dataset.from_list(rows), spec, name)


def test_loaders_read_local_files_in_the_hub_schema(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in RAW_ROWS[("train", "gsm8k")] * 2))
    train = load_train_dataset("gsm8k", data_files=str(path), limit=1)
    assert len(train) == 1 and train[0]["solution"] == "1200"
    path = tmp_path / "amc.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in RAW_ROWS[("bench", "amc23")]))
    bench = load_benchmark("amc23", data_files=str(path))
    assert sorted(bench.column_names) == sorted(ADAPTED_COLUMNS) and bench[0]["answer"] == "27"


def test_limited_mixture_draws_from_every_part(monkeypatch):
    # MATH and GSM8K made up in their schemas, served in place of the Hub download of each part.
    parts = {
        "DigitalLearningGmbH/MATH-lighteval": [
            {"problem": f"m{i}", "level": "1", "type": "t", "solution": f"\\boxed{{{i}}}"} for i in range(50)
        ],
        "openai/gsm8k": [{"question": f"g{i}", "answer": f"#### {i}"} for i in range(50)],
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, *args, **kwargs: Dataset.from_list(parts[hub_id]))
    limited = load_train_dataset("math_gsm8k", limit=20)
    sources = [problem[0] for problem in limited["problem"]]
    assert len(limited) == 20 and {"m", "g"} <= set(sources)  # concatenated in order, all 20 would be MATH rows
    assert limited["problem"] == load_train_dataset("math_gsm8k", limit=20)["problem"]  # the seed fixes the draw
    everything = [row["problem"] for row in parts["DigitalLearningGmbH/MATH-lighteval"]] + [
        row["question"] for row in parts["openai/gsm8k"]
    ]
    assert sorted(load_train_dataset("math_gsm8k")["problem"]) == sorted(everything)  # shuffled, nothing lost


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="aime24"):
        load_benchmark("aime2024")
    with pytest.raises(ValueError, match="math_gsm8k"):
        load_train_dataset("dapo")


def test_bundled_tiny_dataset_is_in_gsm8k_schema():
    dataset = load_train_dataset("gsm8k", data_files="examples/data/tiny_arithmetic.jsonl")
    assert len(dataset) >= 20
    assert all(answer.lstrip("-").isdigit() for answer in dataset["answer"])


def test_hub_dataset_unavailable_offline_names_the_local_file_form(monkeypatch):
    def offline(hub_id, *args, **kwargs):  # what `datasets` raises with HF_HUB_OFFLINE=1 and nothing cached
        raise ConnectionError(f"Couldn't reach '{hub_id}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DatasetUnavailableError, match=r"not available offline.*--benchmarks math500=PATH"):
        load_benchmark("math500")
    with pytest.raises(DatasetUnavailableError, match=r"'archer_code' .*dataset_files"):
        load_train_dataset("archer_code")


def test_a_track_dataset_asked_of_the_data_layer_alone_names_the_module_that_registers_it():
    """The data layer never imports a track: before `riskpo_trl.tracks` is imported, a track's name is unknown to it
    and the error says which import adds it; after, the same call finds it."""
    import subprocess
    import sys

    probe = (
        "from riskpo_trl.data import load_train_dataset\n"
        "try:\n    load_train_dataset('archer_code')\nexcept ValueError as error:\n    print(error)\n"
        "import riskpo_trl.tracks\n"
        "from riskpo_trl.data import TRAIN_DATASETS\n"
        "print('archer_code' in TRAIN_DATASETS, 'geometry3k' in TRAIN_DATASETS)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    error, found = done.stdout.strip().splitlines()[-2:]
    assert "dataset_name='archer_code' is unknown" in error
    assert "(the code and geometry tracks: `import riskpo_trl.tracks` first)" in error
    assert found == "True True"
