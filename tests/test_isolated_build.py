"""A dataset loaded by id (not scanned local files) whose cache build crashes `datasets` is a one-line refusal, and the
process that asked for it lives on. Offline, a local folder given where a Hub id goes stands in for the Hub:
`datasets` reads it as it reads a fetched repository (it infers the builder from the files), and a JSON row nested
200,000 deep in it crashes pyarrow's reader (SIGSEGV) while the cache is built."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from riskpo_trl.data.isolated_build import DatasetBuildCrashedError, load_dataset_isolated

DEPTH = 200_000
TINY_RECIPE = Path(__file__).resolve().parents[1] / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


def deep_repository(tmp_path: Path) -> Path:
    """A folder laid out like a dataset repository whose one row nests ``DEPTH`` lists deep."""
    folder = tmp_path / "deep-repo"
    folder.mkdir()
    row = '{"prompt": "What is 1 + 1?", "solution": "2", "a": ' + "[" * DEPTH + "]" * DEPTH + "}\n"
    (folder / "train.jsonl").write_text(row)
    return folder


def run_python(program: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "cache"))
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def skip_unless_the_plain_build_crashes(folder: Path, tmp_path: Path) -> None:
    """The crash is pyarrow's: some releases (those of the lowest supported end) refuse the depth with an error of
    their own, and there is then no crash to survive."""
    plain = run_python(f"import datasets; datasets.load_dataset({str(folder)!r})", tmp_path / "plain")
    if plain.returncode >= 0:
        pytest.skip(f"this datasets/pyarrow builds the deep row without a crash (exit {plain.returncode})")


def test_a_crashing_build_of_a_dataset_loaded_by_id_is_refused_by_name_and_the_caller_lives(tmp_path):
    folder = deep_repository(tmp_path)
    skip_unless_the_plain_build_crashes(folder, tmp_path)
    program = f"""
from riskpo_trl.data.user_datasets import HUB, load_user_dataset
try:
    load_user_dataset({str(folder)!r}, HUB)
except ValueError as error:
    print("refused:", error)
print("alive")
"""
    finished = run_python(program, tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]  # without the child build: -11, SIGSEGV
    refusal = next(line for line in finished.stdout.splitlines() if line.startswith("refused:"))
    assert str(folder) in refusal and "killed by SIGSEGV" in refusal and "--dataset_files" in refusal
    assert finished.stdout.splitlines()[-1] == "alive"


def test_a_dataset_loaded_by_id_that_builds_is_loaded_from_the_cache_its_child_built(tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps({"prompt": "1 + 1?", "solution": "2"}) + "\n")
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "cache")
    loaded = load_dataset_isolated(str(folder), split="train")
    assert loaded["solution"] == ["2"]
    # The caller's own call opened the cache the child built, under the cache this process names.
    assert loaded.cache_files and all(
        file["filename"].startswith(str(tmp_path / "cache")) for file in loaded.cache_files
    )


def test_an_ordinary_error_in_the_child_is_raised_by_the_callers_own_call(tmp_path, monkeypatch):
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "cache")
    with pytest.raises(FileNotFoundError):
        load_dataset_isolated(str(tmp_path / "no-such-folder"), split="train")
    assert not issubclass(FileNotFoundError, DatasetBuildCrashedError)


@pytest.mark.slow
def test_riskpo_train_refuses_a_registered_hub_dataset_whose_build_crashes(tmp_path, tiny_model_dir):
    """The layout users run: ``riskpo-train`` on a registered dataset's Hub id (here the deep folder); the run stops
    with one ``error:`` line naming the dataset and the signal, exit code 2, and no segfault."""
    folder = deep_repository(tmp_path)
    skip_unless_the_plain_build_crashes(folder, tmp_path)
    recipe = yaml.safe_load(TINY_RECIPE.read_text())
    for key in ("dataset_name", "dataset_files"):
        recipe.pop(key)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    program = f"""
from riskpo_trl.data.datasets import TRAIN_DATASETS, DatasetSpec, add_dataset
from riskpo_trl.scripts import train

add_dataset(TRAIN_DATASETS, "deep_hub", DatasetSpec({str(folder)!r}, "train", "prompt", "solution"))
train.cli(["--config", {str(tmp_path / "recipe.yaml")!r}, "--dataset_name", "deep_hub", "--model_name_or_path", {tiny_model_dir!r}, "--output_dir", {str(tmp_path / "run")!r},
           "--max_steps", "1", "--save_strategy", "no"])
"""
    finished = run_python(program, tmp_path)
    assert finished.returncode == 2, finished.stderr[-3000:]
    error_lines = [line for line in finished.stderr.splitlines() if line.startswith("riskpo-train: error:")]
    assert len(error_lines) == 1 and "killed by SIGSEGV" in error_lines[0] and str(folder) in error_lines[0]


@pytest.mark.parametrize(
    ("killed_by", "cause"),
    [(signal.SIGSEGV, "--dataset_files FILES"), (signal.SIGKILL, "Out of memory"), (signal.SIGTERM, "from outside")],
)
def test_a_killed_child_names_the_signal_and_its_likely_cause(monkeypatch, killed_by, cause):
    """Only a crash of the child's own points at the dataset's files; the OOM killer and a stop from outside do not."""
    import riskpo_trl.data.isolated_build as isolated_build

    monkeypatch.setattr(isolated_build.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, -killed_by))
    with pytest.raises(DatasetBuildCrashedError, match=rf"'someone/rows'.*killed by {killed_by.name}.*{cause}"):
        load_dataset_isolated("someone/rows", split="train")
