"""riskpo-train with a recipe's `pass_at_k:` block: held-out Pass@k is logged next to every training metric."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_DATA = ROOT / "examples/data/tiny_arithmetic.jsonl"


def recipe_with(tmp_path: Path, block: str) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.read_text() + "\n" + block)
    return recipe


def command(tmp_path: Path, recipe: Path) -> list[str]:
    return [
        "--config",
        str(recipe),
        "--model_name_or_path",
        str(tmp_path / "tiny-model"),
        "--output_dir",
        str(tmp_path / "run"),
        "--dataset_files",
        str(TINY_DATA),
        "--max_completion_length",
        "8",
        "--max_steps",
        "4",
        "--save_strategy",
        "no",
    ]


@pytest.mark.slow
def test_a_recipe_pass_at_k_block_logs_held_out_pass_at_k(tmp_path, capsys):
    recipe = recipe_with(
        tmp_path,
        f"""
pass_at_k:
  benchmarks: [gsm8k={TINY_DATA}]
  ks: [1, 2]
  num_samples: 2
  eval_steps: 2
  max_problems: 3
""",
    )
    train.cli(command(tmp_path, recipe))

    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    evaluated = [entry for entry in history if "eval/pass@1" in entry]
    assert [entry["step"] for entry in evaluated] == [0, 2, 4]  # the start, every 2 steps (the end is step 4)
    assert all(set(entry) == {"step", "eval/pass@1", "eval/pass@2", "eval/avg@2"} for entry in evaluated)
    assert all(0 <= entry["eval/pass@1"] <= entry["eval/pass@2"] <= 1 for entry in evaluated)
    for key in ("loss", "learning_rate", "grad_norm"):  # evaluation steps keep their training metrics
        assert sorted(entry["step"] for entry in history if key in entry) == [1, 2, 3, 4], key
    console = capsys.readouterr().out
    assert all(f"[step {step}/4] loss" in console for step in (1, 2, 3, 4))  # a line for every step
    assert "eval/pass@1 " in console  # the evaluation's own console line


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            "pass_at_k:\n  benchmarks: [math500]\n  num_sampels: 4\n",
            "unknown setting(s) num_sampels (did you mean num_samples?)",
        ),
        ("pass_at_k:\n  ks: [1]\n", "name the held-out benchmarks"),
        ("pass_at_k:\n  benchmarks: [math5000]\n", "benchmark='math5000' is unknown (did you mean math500?)"),
        ("pass_at_k:\n  benchmarks: [livecodebench_v5]\n", "'livecodebench_v5' is a code benchmark"),
        (
            "pass_at_k:\n  benchmarks: [math500]\n  num_samples: 4\n  ks: [1, 8]\n",
            "ks=[1, 8] must lie in [1, num_samples=4]",
        ),
        ("pass_at_k:\n  benchmarks: [math500]\n  ks: 8\n", "ks=8 must be a list of integers"),
        ("pass_at_k:\n  benchmarks: [math500]\n  eval_steps: 0\n", "eval_steps=0 must be a positive integer"),
        ("pass_at_k:\n  benchmarks: [math500]\n  top_p: 1.5\n", "top_p=1.5 must be a number in [0.0, 1.0]"),
    ],
)
def test_pass_at_k_block_mistakes_are_one_error_line(tmp_path, capsys, block, message):
    with pytest.raises(SystemExit) as exit:
        train.cli(command(tmp_path, recipe_with(tmp_path, block)))
    assert exit.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert message in line
    assert not (tmp_path / "tiny-model").exists()  # found before anything was built or loaded


def test_riskpo_train_uses_the_cpu_thread_default(tmp_path, monkeypatch, caplog):
    import torch

    from riskpo_trl.scripts import cpu_threads

    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    monkeypatch.setattr(train, "prepare", lambda *args: (None, None))  # stop before building anything
    try:
        with caplog.at_level(logging.WARNING, logger="riskpo_trl.scripts.cpu_threads"):
            train.cli(command(tmp_path, TINY_RECIPE))  # the recipe sets use_cpu: true
    finally:
        torch.set_num_threads(threads)
    assert "CPU run: 1 torch thread(s)" in caplog.text
