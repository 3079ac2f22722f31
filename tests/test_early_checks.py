"""riskpo-train's checks before torch and TRL load (riskpo_trl.scripts.early_checks): each common mistake is refused
with the later check's message and without the heavy imports; the arithmetic and the light reader agree with what
they stand in for. Their CPU time is measured by benchmarks/cli_startup.py, not here."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_config

from riskpo_trl.scripts import early_checks, known_options, known_options_data

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml")
HEAVY_MODULES = ("torch", "transformers", "trl", "datasets", "accelerate")
PROBE = """
import sys
from riskpo_trl.scripts.train import cli
try:
    cli(sys.argv[1:])
    code = 0
except SystemExit as exit:
    code = exit.code
print("PROBE", code, ",".join(name for name in {heavy!r} if name in sys.modules))
"""
LIST_MATCHES = known_options.installed_versions() == known_options_data.VERSIONS
needs_the_list = pytest.mark.skipif(not LIST_MATCHES, reason="the option list is for other TRL/transformers versions")


def run_cli(argv: list[str], cwd: Path, script: str = "train") -> tuple[int, list[str], str]:
    """(exit code, the heavy modules imported, stdout + stderr) of ``riskpo-train ARGV`` (or the console script of
    ``riskpo_trl.scripts.<script>``) in a fresh interpreter, offline."""
    probe = PROBE.replace("riskpo_trl.scripts.train", f"riskpo_trl.scripts.{script}")
    result = subprocess.run(
        [sys.executable, "-c", probe.format(heavy=HEAVY_MODULES), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        check=False,
    )
    probe = result.stdout.strip().splitlines()[-1].split(" ")
    assert probe[0] == "PROBE", result.stdout + result.stderr
    return int(probe[1]), [name for name in probe[2:] if name], result.stdout + result.stderr


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


QUESTIONS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


@needs_the_list
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--bundle_size", "3"],
            "--bundle_size (command line): A generation batch holds 2 prompts (generation_batch_size=8 / "
            "num_generations=4), which is not a multiple of bundle_size=3.",
        ),
        (
            ["--model_name_or_path", "./no-such-model", "--build_tiny_model", "false"],
            "model_name_or_path './no-such-model': no such directory, and not a Hub id",
        ),
        (
            ["--dataset_name", "json", "--dataset_files", "{tmp}/questions.jsonl"],
            "The training dataset has no 'prompt' column (its columns: ['question', 'answer']).",
        ),
        (
            ["--dataset_name", "json", "--dataset_files", "{tmp}/questions.jsonl", "--prompt_column", "question"]
            + ["--answer_column", "answr"],
            "answer_column='answr': the training dataset 'json' has no such column (did you mean answer?)",
        ),
    ],
)
def test_a_mistake_is_refused_before_torch_loads(tmp_path, argv, message):
    write_rows(tmp_path / "questions.jsonl", QUESTIONS)
    argv = [token.format(tmp=tmp_path) for token in argv]
    code, heavy, printed = run_cli(["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "run"), *argv], ROOT)
    assert code == 2, printed
    assert f"riskpo-train: error: {message}" in printed
    assert heavy == [], f"the check imported {heavy}"
    assert not (tmp_path / "run").exists()  # refused before the run's lock creates output_dir


@needs_the_list
def test_a_busy_output_dir_is_refused_before_torch_loads(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from riskpo_trl.job.run_lock import acquire; "
         "acquire(sys.argv[1]); print('locked', flush=True); time.sleep(600)", str(tmp_path / "run")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, heavy, printed = run_cli(["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "run")], ROOT)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and f"output_dir {tmp_path / 'run'} is in use by another run: PID {holder.pid}" in printed
    assert heavy == []


@needs_the_list
def test_a_finished_run_says_so_before_torch_loads(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoint-6"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    (checkpoint / "model.safetensors").write_text("weights")
    (checkpoint / "optimizer.pt").write_text("state")
    code, heavy, printed = run_cli(["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "run")], ROOT)
    assert code == 0 and heavy == []
    assert f"Nothing to train: the run in {tmp_path / 'run'} is finished" in printed
    assert "max_steps=6); its final model was copied from that checkpoint" in printed
    assert (tmp_path / "run" / "model.safetensors").is_file()  # the final save restored, as the later path does
    assert not (tmp_path / "run" / "optimizer.pt").exists()
    raised = argparse.Namespace(max_steps=9, num_train_epochs=3.0)
    assert early_checks.finished_run(str(checkpoint), raised) is None  # a raised max_steps goes on to train


@needs_the_list
def test_other_data_in_output_dir_is_refused_before_torch_loads(tmp_path):
    from riskpo_trl.scripts.run_data import RECORD_NAME

    checkpoint = tmp_path / "run" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    record = {"dataset_name": "gsm8k", "dataset_config": None, "dataset_train_split": "train", "dataset_files": ["x"]}
    state = {"global_step": 3, "stateful_callbacks": {RECORD_NAME: {"args": record}}}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    code, heavy, printed = run_cli(["--config", TINY_RECIPE, "--output_dir", str(tmp_path / "run")], ROOT)
    assert code == 2 and heavy == []
    assert f"{tmp_path / 'run'} holds a run trained on gsm8k (x)" in printed


def layout(**values) -> argparse.Namespace:
    return early_checks.with_layout_defaults(argparse.Namespace(**values), "riskpo")


@needs_the_list
def test_the_layout_arithmetic_is_the_configs(monkeypatch):
    """Over a grid of layouts, the check before imports refuses exactly those RiskPOConfig refuses for their bundles,
    with its message; layouts GRPOConfig itself refuses are left to it."""
    import warnings

    from riskpo_trl import RiskPOConfig

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    grid = itertools.product((2, 3, 8), (1, 2), (None, 1, 3), (None, 12), (2, 4), (1, 2, 3))
    compared = 0
    for per_device, accumulation, steps, batch, generations, bundle in grid:
        fields = {
            "per_device_train_batch_size": per_device,
            "gradient_accumulation_steps": accumulation,
            "steps_per_generation": steps,
            "generation_batch_size": batch,
            "num_generations": generations,
            "bundle_size": bundle,
        }
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                RiskPOConfig(output_dir="unused", use_cpu=True, **fields)
            expected = None
        except ValueError as error:
            expected = str(error)
        try:
            early_checks.check_bundle_layout(layout(**fields))
            early = None
        except ValueError as error:
            early = str(error)
        if expected is not None and expected.startswith("A generation batch holds"):
            assert early == expected, fields
            compared += 1
        else:
            assert early is None, (fields, early, expected)
    assert compared > 20  # the grid holds refused layouts, not only accepted ones


@needs_the_list
def test_the_process_count_enters_the_layout(monkeypatch):
    fields = {"per_device_train_batch_size": 4, "num_generations": 4, "bundle_size": 2, "steps_per_generation": 1}
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="holds 1 prompts"):
        early_checks.check_bundle_layout(layout(**fields))
    monkeypatch.setenv("WORLD_SIZE", "2")
    early_checks.check_bundle_layout(layout(**fields))  # 2 processes: 2 prompts, one bundle group


def test_several_processes_leave_the_output_dir_to_the_main_one(tmp_path, monkeypatch):
    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    values = argparse.Namespace(output_dir=str(tmp_path), resume_from_checkpoint=None, max_steps=6)
    values.__dict__.update(dataset_name="gsm8k", dataset_config=None, dataset_train_split="train", dataset_files=None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert early_checks.check_output_dir(values) is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert early_checks.check_output_dir(values).startswith("Nothing to train")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_the_light_reader_sees_the_columns_datasets_sees(tmp_path, suffix):
    import datasets

    from riskpo_trl.data.local_files import peek_columns, reader_of

    rows = [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2", "source": "s"}]
    table = datasets.Dataset.from_list([{"source": None, **row} for row in rows]).select_columns(
        ["question", "answer", "source"]
    )
    path = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        write_rows(path, rows)
    elif suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif suffix == ".csv":
        table.to_csv(path, index=False)
    else:
        table.to_parquet(path)
    loaded = datasets.load_dataset(reader_of(path), data_files=[str(path)], split="train")
    assert peek_columns([str(path)]) == (loaded.column_names, len(loaded))


def test_the_light_reader_leaves_what_it_cannot_read(tmp_path):
    from riskpo_trl.data.local_files import peek_columns

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\n{"prompt": \n')
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps({"prompt": ["a", "b"], "solution": ["1", "2"]}))
    assert peek_columns([str(broken)]) is None and peek_columns([str(columns)]) is None


@needs_the_list
def test_too_few_rows_are_refused_before_torch_loads_as_the_trainer_refuses_them(tmp_path):
    from helpers import make_prompt_dataset

    from riskpo_trl.job.checks import check_generation_batch_fits

    rows = make_prompt_dataset(3)
    rows.to_json(tmp_path / "rows.jsonl")
    layout = {"per_device_train_batch_size": 8, "num_generations": 4, "steps_per_generation": 2, "bundle_size": 2}
    layout["gradient_accumulation_steps"] = 1
    argv = [f"--{name}={value}" for name, value in layout.items()]
    data = ["--dataset_name", "json", "--dataset_files", str(tmp_path / "rows.jsonl")]
    code, heavy, printed = run_cli(["--config", TINY_RECIPE, *data, *argv, "--output_dir", str(tmp_path / "r")], ROOT)
    config = tiny_config(tmp_path, run=False, use_cpu=True, bf16=False, **layout)
    with pytest.raises(ValueError) as later:
        check_generation_batch_fits(rows, config)
    assert code == 2 and heavy == []
    assert f"riskpo-train: error: {later.value}" in printed


def test_riskpo_eval_refuses_a_wrong_answer_column_before_torch_loads(tmp_path):
    rows = write_rows(tmp_path / "questions.jsonl", QUESTIONS)
    (tmp_path / "model").mkdir()
    argv = ["--model", str(tmp_path / "model"), "--dataset_files", str(rows), "--answer_column", "answr"]
    argv += ["--prompt_column", "question", "--output_dir", str(tmp_path / "eval")]
    code, heavy, printed = run_cli(argv, ROOT, script="eval")
    assert code == 2 and heavy == []
    assert f"riskpo-eval: error: answer_column='answr': {rows} has no such column (did you mean answer?)" in printed
