"""Your own dataset from the command line, as TRL's scripts take it: ``--dataset_name json --dataset_files rows.jsonl``
(csv, parquet), a local dataset directory, or a Hub id (read here from a pre-populated offline cache), used as it is
when it has a ``prompt`` column. Each trains the tiny model end to end through ``riskpo-train``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import pytest
import yaml
from datasets import Dataset, DatasetDict
from test_start_up_errors import run_cli  # the single 'error:' line, exit code 2, no traceback

from riskpo_trl.data import load_train_dataset
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"

ROWS = [
    {
        "prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the answer in \\boxed{{}}."}],
        "solution": str(a + b),
    }
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]
]
TEXT_ROWS = [{"prompt": row["prompt"][0]["content"], "solution": row["solution"]} for row in ROWS]


def recipe_without_data(tmp_path: Path) -> Path:
    """The tiny recipe without its registered dataset, so a test names the dataset on the command line only."""
    recipe = yaml.safe_load(TINY_RECIPE.read_text())
    for key in ("dataset_name", "dataset_files"):
        recipe.pop(key)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train_on(tmp_path: Path, tiny_model_dir: str, *dataset_options: str) -> Path:
    """Two optimizer steps of riskpo-train on the dataset the options name; returns the output directory."""
    output_dir = tmp_path / "run"
    train.cli(
        [
            "--config",
            str(recipe_without_data(tmp_path)),
            "--model_name_or_path",
            tiny_model_dir,
            "--output_dir",
            str(output_dir),
            "--max_steps",
            "2",
            "--save_strategy",
            "no",
            "--max_completion_length",
            "8",
            *dataset_options,
        ]
    )
    return output_dir


def trained_steps(output_dir: Path) -> int:
    return json.loads((output_dir / "trainer_state.json").read_text())["global_step"]


def test_json_rows_with_a_prompt_train_from_the_command_line(tmp_path, tiny_model_dir):
    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    output_dir = train_on(tmp_path, tiny_model_dir, "--dataset_name", "json", "--dataset_files", str(rows))
    assert trained_steps(output_dir) == 2
    card = (output_dir / "README.md").read_text()
    assert "`rows.jsonl`" in card  # the card names the local file it trained on


def make_csv(tmp_path: Path) -> list[str]:
    path = tmp_path / "rows.csv"
    Dataset.from_list(TEXT_ROWS).to_csv(path)
    return ["--dataset_name", "csv", "--dataset_files", str(path)]


def make_parquet(tmp_path: Path) -> list[str]:
    path = tmp_path / "rows.parquet"
    Dataset.from_list(ROWS).to_parquet(path)
    return ["--dataset_name", "parquet", "--dataset_files", str(path)]


def make_saved_dataset_dict(tmp_path: Path) -> list[str]:
    directory = tmp_path / "saved"
    DatasetDict({"train": Dataset.from_list(ROWS[:1]), "rl": Dataset.from_list(ROWS)}).save_to_disk(directory)
    return ["--dataset_name", str(directory), "--dataset_train_split", "rl"]


def make_folder_of_files(tmp_path: Path) -> list[str]:
    directory = tmp_path / "folder"
    directory.mkdir()
    write_jsonl(directory / "train.jsonl", ROWS)
    return ["--dataset_name", str(directory)]


@pytest.mark.parametrize(
    "make",
    [make_csv, make_parquet, make_saved_dataset_dict, make_folder_of_files],
    ids=["csv", "parquet", "save_to_disk", "folder"],
)
def test_other_formats_and_local_directories_train(tmp_path, tiny_model_dir, make):
    options = make(tmp_path)
    output_dir = train_on(tmp_path, tiny_model_dir, *options)
    assert trained_steps(output_dir) == 2
    local = Path(options[options.index("--dataset_files") + 1] if "--dataset_files" in options else options[1])
    assert f"`{local.name}`" in (output_dir / "README.md").read_text()  # the card names the local data


def cache_as_hub_dataset(cache_dir: Path, repo_id: str, rows_file: Path) -> None:
    """Write ``rows_file`` into the datasets cache the way loading ``repo_id`` from the Hub once leaves it
    (``namespace___name/default/0.0.0/<commit>/name-train.arrow``), where the offline mode of ``datasets`` finds it."""
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    builder = Json(
        cache_dir=str(cache_dir),
        dataset_name=f"{namespace}___{name}",
        hash="0" * 40,
        config_id="default",
        data_files={"train": str(rows_file)},
    )
    builder.download_and_prepare()
    prepared = Path(builder.cache_dir)
    (prepared / f"{namespace}___{name}-train.arrow").rename(prepared / f"{name}-train.arrow")


def offline_with_cache(monkeypatch, cache_dir: Path) -> None:
    """HF_HUB_OFFLINE as `datasets` and `huggingface_hub` read it (both read the environment at import, before the
    suite's conftest sets it), and an empty datasets cache of the test's own."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache_dir)


def test_a_hub_id_trains_from_the_offline_cache(tmp_path, tiny_model_dir, monkeypatch):
    """The Hub path as a user without a network takes it: HF_HUB_OFFLINE and the dataset in the local cache. The
    card names the Hub dataset."""
    offline_with_cache(monkeypatch, tmp_path / "cache")
    cache_as_hub_dataset(tmp_path / "cache", "someone/arith-prompts", write_jsonl(tmp_path / "rows.jsonl", ROWS))
    output_dir = train_on(tmp_path, tiny_model_dir, "--dataset_name", "someone/arith-prompts")
    assert trained_steps(output_dir) == 2
    assert "datasets:\n- someone/arith-prompts" in (output_dir / "README.md").read_text()


def test_a_hub_id_gets_its_config_and_split(monkeypatch):
    """What reaches load_dataset for a Hub id: the id, dataset_config and dataset_train_split."""
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return Dataset.from_list(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    loaded = load_train_dataset("someone/arith", split="rl", config="easy")
    assert calls == [(("someone/arith", "easy"), {"split": "rl", "data_files": None})]
    assert loaded.column_names == ["prompt", "solution"]  # as it is: no adapter


def test_a_hub_id_missing_offline_is_one_line(tmp_path, capsys, monkeypatch):
    offline_with_cache(monkeypatch, tmp_path / "cache")
    line = run_cli_error(["--dataset_name", "someone/not-cached"], tmp_path, capsys, str(tmp_path / "tiny"))
    assert "'someone/not-cached' is not available offline" in line and "save_to_disk" in line


def run_cli_error(options: list[str], tmp_path: Path, capsys, model_dir: str) -> str:
    return run_cli(
        train.cli,
        [
            "--config",
            str(recipe_without_data(tmp_path)),
            "--output_dir",
            str(tmp_path / "run"),
            "--model_name_or_path",
            model_dir,
            *options,
        ],
        capsys,
    )


def test_rows_without_a_prompt_or_a_rewards_column_are_one_line(tmp_path, tiny_model_dir, capsys):
    no_prompt = write_jsonl(
        tmp_path / "questions.jsonl",
        [{"question": r["prompt"][0]["content"], "solution": r["solution"]} for r in ROWS],
    )
    line = run_cli_error(
        ["--dataset_name", "json", "--dataset_files", str(no_prompt)], tmp_path, capsys, tiny_model_dir
    )
    assert "The training dataset has no 'prompt' column (its columns: ['question', 'solution'])" in line
    no_solution = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": r["prompt"]} for r in ROWS])
    line = run_cli_error(
        ["--dataset_name", "json", "--dataset_files", str(no_solution)], tmp_path, capsys, tiny_model_dir
    )
    assert "reads the column(s) ['solution'], which the training dataset lacks" in line


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--dataset_name", "json"], "dataset_name='json' reads local json files: give them with dataset_files"),
        (["--dataset_name", "json", "--dataset_files", "nowhere.jsonl"], "Dataset file nowhere.jsonl: no such file."),
        (["--dataset_name", "./no-such-dir"], "dataset_name='./no-such-dir': no such directory"),
        (["--dataset_name", "dapo_mat"], "dataset_name='dapo_mat' is unknown (did you mean dapo_math?)"),
        (["--dataset_name", "gsm8k", "--dataset_config", "main"], "dataset_config applies to a Hub id or a local"),
        (
            ["--dataset_name", "gsm8k", "--prompt_template", "raw"],
            "prompt_template='raw' keeps the text prompt column of a dataset used as it is; 'gsm8k' is registered",
        ),
    ],
)
def test_dataset_mistakes_are_one_line_before_anything_loads(tmp_path, capsys, options, expected):
    model_dir = str(tmp_path / "never-built")
    line = run_cli_error(options, tmp_path, capsys, model_dir)
    assert expected in line
    assert not os.path.exists(model_dir)  # nothing was built


def test_a_recipe_names_a_json_dataset_relative_to_its_repository(tmp_path, tiny_model_dir, monkeypatch):
    """A recipe in its own repository, run from elsewhere: its relative dataset_files are read from that
    repository, and the run's outputs go where it runs."""
    repository = tmp_path / "project"
    (repository / "recipes" / "mine").mkdir(parents=True)
    (repository / "data").mkdir()
    write_jsonl(repository / "data" / "rows.jsonl", ROWS)
    recipe = yaml.safe_load(TINY_RECIPE.read_text())
    recipe.update(
        dataset_name="json",
        dataset_files=["data/rows.jsonl"],
        model_name_or_path=tiny_model_dir,
        output_dir="outputs/mine",
        max_steps=2,
        save_strategy="no",
        max_completion_length=8,
    )
    recipe_path = repository / "recipes" / "mine" / "config.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    train.cli(["--config", str(recipe_path)])
    assert trained_steps(elsewhere / "outputs" / "mine") == 2
