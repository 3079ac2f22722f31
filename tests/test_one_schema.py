"""One schema for both commands: riskpo-eval reads riskpo-train's rows (``prompt`` + ``solution``) as well as
``problem`` + ``answer``; both take ``--prompt_column`` / ``--answer_column`` for other names, and a GSM8K answer
(``... #### 42``) is read as its final answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_evaluator import ScriptedBackend
from test_start_up_errors import run_cli
from test_user_datasets import ROWS, run_cli_error, train_on, trained_steps, write_jsonl
from transformers import AutoTokenizer

from riskpo_trl.data import AUTHORS_INSTRUCTION, load_train_dataset, make_prompt
from riskpo_trl.evaluation import EvalConfig, evaluate
from riskpo_trl.scripts import eval as eval_script

GSM8K_ROWS = [
    {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b:,}"}
    for a, b in [(1, 2), (3, 4), (500, 600), (7000, 8000)]
]
GOLD = ["3", "7", "1100", "15000"]  # thousands separators dropped, as the gsm8k adapter does


def test_riskpo_train_maps_a_gsm8k_file_and_reads_its_final_answers(tmp_path, tiny_model_dir):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    loaded = load_train_dataset("json", data_files=[str(rows)], prompt_column="question", answer_column="answer")
    assert loaded["solution"] == GOLD and loaded["prompt"] == [make_prompt(row["question"]) for row in GSM8K_ROWS]
    output_dir = train_on(
        tmp_path,
        tiny_model_dir,
        "--dataset_name",
        "json",
        "--dataset_files",
        str(rows),
        "--prompt_column",
        "question",
        "--answer_column",
        "answer",
    )
    assert trained_steps(output_dir) == 2


def test_riskpo_train_without_the_mapping_names_it(tmp_path, tiny_model_dir, capsys):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    line = run_cli_error(["--dataset_name", "json", "--dataset_files", str(rows)], tmp_path, capsys, tiny_model_dir)
    assert "no 'prompt' column" in line and "--prompt_column question" in line
    line = run_cli_error(
        ["--dataset_name", "json", "--dataset_files", str(rows), "--prompt_column", "question"],
        tmp_path,
        capsys,
        tiny_model_dir,
    )
    assert "reads the column(s) ['solution']" in line and "--answer_column NAME" in line


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--answer_column", "answr"],
            (
                "answer_column='answr': the training dataset 'json' has no such column (did you mean answer?); its columns: "
                "['question', 'answer']."
            ),
        ),
        (
            ["--prompt_column", "answer", "--answer_column", "answer"],
            "prompt_column and answer_column name the same column",
        ),
        (
            ["--dataset_name", "gsm8k", "--answer_column", "answer"],
            "'gsm8k' is registered and its adapter maps its columns",
        ),
    ],
    ids=["typo", "one column twice", "registered dataset"],
)
def test_riskpo_train_mapping_mistakes_are_one_line(tmp_path, tiny_model_dir, capsys, options, expected):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    line = run_cli_error(
        ["--dataset_name", "json", "--dataset_files", str(rows), *options], tmp_path, capsys, tiny_model_dir
    )
    assert expected in line


def gsm8k_answers(backend_answers: list[str]) -> dict[str, list[str]]:
    return {row["question"]: [f"\\boxed{{{answer}}}"] for row, answer in zip(GSM8K_ROWS, backend_answers)}


def test_riskpo_eval_reads_a_gsm8k_file_through_the_mapping(tmp_path):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    config = EvalConfig(
        model="scripted",
        dataset_files=[str(rows)],
        prompt_column="question",
        answer_column="answer",
        num_samples=1,
        output_dir=str(tmp_path / "eval"),
    )
    results = evaluate(config, backend=ScriptedBackend(gsm8k_answers([*GOLD[:3], "14999"])), progress=False)
    records = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [record["answer"] for record in records] == GOLD
    assert [record["scores"] for record in records] == [[1.0], [1.0], [1.0], [0.0]]
    assert results["benchmarks"]["gsm8k"]["metrics"]["pass@1"] == 0.75


def test_riskpo_eval_reads_the_training_schema(tmp_path, tiny_model_dir):
    """The file riskpo-train reads (chat-message prompts and text prompts, ``solution``) evaluates with the prompts
    training gives it: chat messages as they are, a text as a user turn with the instruction."""
    messages = write_jsonl(tmp_path / "messages.jsonl", ROWS)
    texts = write_jsonl(
        tmp_path / "texts.jsonl",
        [{"prompt": row["prompt"][0]["content"], "solution": row["solution"]} for row in ROWS],
    )
    results = eval_script.main(
        [
            "--model",
            tiny_model_dir,
            "--dataset_files",
            str(messages),
            str(texts),
            "--num_samples",
            "1",
            "--max_new_tokens",
            "2",
            "--backend",
            "transformers",
            "--output_dir",
            str(tmp_path / "eval"),
        ]
    )
    assert {name: summary["num_scored"] for name, summary in results["benchmarks"].items()} == {
        "messages": 4,
        "texts": 4,
    }
    records = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [record["answer"] for record in records] == [row["solution"] for row in ROWS] * 2
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text_prompt = make_prompt(ROWS[0]["prompt"][0]["content"])  # a text prompt, prompted as in training
    assert records[4]["prompt"] == tokenizer.apply_chat_template(
        text_prompt, tokenize=False, add_generation_prompt=True
    )


def test_riskpo_eval_names_the_mapping_when_the_columns_are_missing(tmp_path, tiny_model_dir, capsys):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    line = run_cli(
        eval_script.cli,
        ["--model", tiny_model_dir, "--dataset_files", str(rows), "--output_dir", str(tmp_path / "eval")],
        capsys,
    )
    assert "row 0: missing field(s) ['problem']" in line and "--prompt_column NAME" in line
    line = run_cli(
        eval_script.cli,
        [
            "--model",
            tiny_model_dir,
            "--dataset_files",
            str(rows),
            "--prompt_column",
            "questoin",
            "--output_dir",
            str(tmp_path / "eval"),
        ],
        capsys,
    )
    assert "prompt_column='questoin'" in line and "(did you mean question?)" in line
    line = run_cli(
        eval_script.cli,
        [
            "--model",
            tiny_model_dir,
            "--benchmarks",
            "math500",
            "--answer_column",
            "answer",
            "--output_dir",
            str(tmp_path / "eval"),
        ],
        capsys,
    )
    assert "prompt_column and answer_column name columns of the dataset_files rows" in line


# --- what results.md and samples.jsonl say


def test_results_say_which_model_how_many_problems_which_prompts_and_sampling(tmp_path, tiny_model_dir):
    toy = Path(__file__).parent / "data" / "toy_math.jsonl"
    texts = write_jsonl(
        tmp_path / "texts.jsonl",
        [{"prompt": row["prompt"][0]["content"], "solution": row["solution"]} for row in ROWS],
    )
    output_dir = tmp_path / "eval"
    eval_script.main(
        [
            "--model",
            tiny_model_dir,
            "--dataset_files",
            str(toy),
            str(texts),
            "--num_samples",
            "2",
            "--max_new_tokens",
            "2",
            "--max_problems",
            "3",
            "--prompt_template",
            "authors",
            "--backend",
            "transformers",
            "--output_dir",
            str(output_dir),
        ]
    )
    table = (output_dir / "results.md").read_text()
    assert f"Model: `{tiny_model_dir}` (the tiny RANDOM model" in table
    assert "| Problems scored | 3/3 | 3/3 | 6/6 |" in table
    assert (
        '- toy_math: `authors`: "{problem} Let\'s think step by step and output the final answer within \\\\boxed{}."'
    ) in table
    assert "- texts: `authors`: " in table  # a text prompt column gets the template, as in training
    assert "rendered with the tokenizer's chat template" in table
    assert "Sampling: 2 completions per problem" in table
    records = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    first = records[0]
    message = {"role": "user", "content": f"{first['problem']} {AUTHORS_INSTRUCTION}"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert first["prompt"] == tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True)


def test_a_real_model_is_not_called_random(tmp_path):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    config = EvalConfig(
        model="scripted",
        dataset_files=[str(rows)],
        prompt_column="question",
        answer_column="answer",
        num_samples=1,
        output_dir=str(tmp_path / "eval"),
    )
    evaluate(config, backend=ScriptedBackend(gsm8k_answers(GOLD)), progress=False)
    table = (tmp_path / "eval" / "results.md").read_text()
    assert table.startswith("Model: `scripted`.\n") and "RANDOM" not in table
    assert "joined as plain text (the tokenizer has no chat template)" in table


def test_resuming_with_another_prompt_template_is_refused(tmp_path):
    toy = str(Path(__file__).parent / "data" / "toy_math.jsonl")
    answers = {
        "2 + 3": ["\\boxed{5}"],
        "7 - 4": ["\\boxed{3}"],
        "6 / 3": ["\\boxed{2}"],
        "half of 1": ["\\boxed{1}"],
        "lost its gold answer": ["\\boxed{1}"],
    }
    output_dir = str(tmp_path / "eval")
    evaluate(
        EvalConfig(model="scripted", dataset_files=[toy], num_samples=1, max_problems=2, output_dir=output_dir),
        backend=ScriptedBackend(answers),
        progress=False,
    )
    with pytest.raises(ValueError, match=r"prompted with prompt_template='qwen_boxed' \(now 'authors'\)"):
        evaluate(
            EvalConfig(
                model="scripted",
                dataset_files=[toy],
                num_samples=1,
                prompt_template="authors",
                resume=True,
                output_dir=output_dir,
            ),
            backend=ScriptedBackend(answers),
            progress=False,
        )
    resumed = evaluate(
        EvalConfig(model="scripted", dataset_files=[toy], num_samples=1, resume=True, output_dir=output_dir),
        backend=ScriptedBackend(answers),
        progress=False,
    )
    assert resumed["benchmarks"]["toy_math"]["num_scored"] == 5
