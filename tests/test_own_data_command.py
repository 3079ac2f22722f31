"""The README's own-data command trains the first time, after the README's first run, through the CLI: data named on
the command line replaces the recipe's data settings, and a directory that holds a run on other data is refused in one
line that says what it was trained on, what was asked and how to start a new run."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TINY_RECIPE = "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


def readme_argv(which: str) -> list[str]:
    """The arguments of the README's riskpo-train command of that block (the .ci reader's view of it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_setup", ROOT / ".ci" / "readme_setup.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    commands = reader.own_data_commands(README) if which == "own_data" else reader.block_commands(README)
    [command] = [part.strip() for line in commands for part in line.split("&&") if "riskpo-train" in part]
    return shlex.split(command)[1:]


@pytest.fixture(scope="module")
def after_first_run(tmp_path_factory):
    """A copy of the checkout's recipe and data in a fresh directory, where the README's first run has finished."""
    checkout = tmp_path_factory.mktemp("checkout")
    for relative in (TINY_RECIPE, "examples/data/tiny_arithmetic.jsonl", "examples/data/tiny_rows.jsonl"):
        (checkout / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, checkout / relative)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(checkout)
        train.cli(readme_argv("setup"))
    assert (checkout / "outputs/tiny-riskpo-arithmetic/config.json").is_file()
    return checkout


def test_the_readme_own_data_command_trains_on_the_users_rows(after_first_run, monkeypatch, capsys):
    monkeypatch.chdir(after_first_run)
    argv = readme_argv("own_data")
    assert "--output_dir" in argv
    train.cli(argv)
    out = capsys.readouterr().out
    rows = len((ROOT / "examples/data/tiny_rows.jsonl").read_text().splitlines())
    assert f"Training on json (examples/data/tiny_rows.jsonl): {rows} rows." in out
    output_dir = after_first_run / argv[argv.index("--output_dir") + 1]
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] > 0
    assert state["stateful_callbacks"]["TrainingDataRecord"]["args"]["dataset_name"] == "json"


def test_a_finished_run_asked_for_other_data_says_so_in_one_line(after_first_run, monkeypatch, capsys):
    monkeypatch.chdir(after_first_run)
    argv = readme_argv("own_data")
    at = argv.index("--output_dir")
    del argv[at : at + 2]  # the recipe's own output_dir, where the first run finished
    with pytest.raises(SystemExit) as exit:
        train.cli(argv)
    assert exit.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line == (
        "riskpo-train: error: outputs/tiny-riskpo-arithmetic holds a run trained on gsm8k "
        "(examples/data/tiny_arithmetic.jsonl); this command asks for json (examples/data/tiny_rows.jsonl). To train "
        "on it, start a new run: give another --output_dir (or remove outputs/tiny-riskpo-arithmetic)."
    )


def test_the_same_data_again_is_still_nothing_to_train(after_first_run, monkeypatch, capsys):
    monkeypatch.chdir(after_first_run)
    train.cli(readme_argv("setup"))
    assert "Nothing to train: the run in outputs/tiny-riskpo-arithmetic is finished" in capsys.readouterr().out


def test_a_command_line_dataset_replaces_every_data_setting_of_the_recipe(tmp_path):
    rows = ROOT / "examples/data/tiny_rows.jsonl"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        (ROOT / TINY_RECIPE)
        .read_text()
        .replace("dataset_name: gsm8k", ("dataset_name: gsm8k\ndataset_train_split: test\nmax_train_samples: 3"))
        .replace("examples/data/tiny_arithmetic.jsonl", str(ROOT / "examples/data/tiny_arithmetic.jsonl"))
    )
    script_args, _, _ = train.parse_args(
        ["--config", str(recipe), "--dataset_name", "json", "--dataset_files", str(rows)]
    )
    assert (script_args.dataset_name, script_args.dataset_files) == ("json", [str(rows)])
    assert (script_args.dataset_config, script_args.dataset_train_split, script_args.max_train_samples) == (
        None,
        "train",
        None,
    )
    # --dataset_files alone keeps the recipe's dataset_name: the schema its files are read in.
    script_args, _, _ = train.parse_args(
        ["--config", str(recipe), "--dataset_files", str(rows), "--max_train_samples", "5"]
    )
    assert (script_args.dataset_name, script_args.dataset_train_split, script_args.max_train_samples) == (
        "gsm8k",
        "train",
        5,
    )
    # Without data on the command line, the recipe's settings stand.
    script_args, _, _ = train.parse_args(["--config", str(recipe)])
    assert (script_args.dataset_train_split, script_args.max_train_samples) == ("test", 3)
