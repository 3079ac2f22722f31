"""The DeepSpeed part of the GPU check, without launching it: which config each run gets, and what counts as
agreeing with the run without DeepSpeed or as an exact resume (its CPU dry run is a slow test in test_gpu_check.py)."""

from __future__ import annotations

import math

import yaml

from benchmarks import gpu_deepspeed
from benchmarks.step_records import first_step_metrics, steps_differing


def test_a_gpu_run_takes_the_recipe_config_with_one_process(tmp_path):
    for stage, recipe in gpu_deepspeed.STAGES.items():
        path, changes = gpu_deepspeed.launch_config(stage, dry_run=False, out=tmp_path)
        assert changes == {"num_processes": 1}
        assert yaml.safe_load(path.read_text()) == {**yaml.safe_load(recipe.read_text()), "num_processes": 1}


def test_a_dry_run_takes_the_cpu_settings_of_zero3_cpu(tmp_path):
    cpu = yaml.safe_load((gpu_deepspeed.CONFIGS / "zero3_cpu.yaml").read_text())
    path, _ = gpu_deepspeed.launch_config("zero3", dry_run=True, out=tmp_path)
    config = yaml.safe_load(path.read_text())
    for key in gpu_deepspeed.CPU_SETTINGS:
        assert config[key] == cpu[key]
    assert config["deepspeed_config"]["zero_stage"] == 3
    assert config["deepspeed_config"]["zero3_init_flag"] is False


def run(loss=0.0, grad_norm=1.0, entropy=11.9, completions=((1, 2),)):
    return {
        "first_step": {"loss": loss, "grad_norm": grad_norm, "entropy": entropy},
        "steps": {"1": {"completion_ids": [list(c) for c in completions]}},
    }


def test_a_first_step_off_by_more_than_the_bf16_tolerance_fails():
    tolerance = gpu_deepspeed.BF16_TOLERANCE
    close = gpu_deepspeed.compare_first_steps(run(), run(grad_norm=1.0 + tolerance["grad_norm"] / 2), tolerance)
    assert close["ok"] and close["same_completions"]
    far = gpu_deepspeed.compare_first_steps(run(), run(grad_norm=1.0 + 2 * tolerance["grad_norm"]), tolerance)
    assert not far["ok"] and far["agree"] == {"loss": True, "entropy": True, "grad_norm": False}
    entropy = 11.9 * (1 + 2 * tolerance["entropy"])
    assert not gpu_deepspeed.compare_first_steps(run(), run(entropy=entropy), tolerance)["ok"]
    missing = run()
    del missing["first_step"]["grad_norm"]  # a figure not logged is not an agreement
    assert not gpu_deepspeed.compare_first_steps(run(), missing, tolerance)["ok"]
    other = gpu_deepspeed.compare_first_steps(run(), run(completions=((1, 3),)), tolerance)
    assert not other["same_completions"]


def test_values_near_zero_are_compared_absolutely():
    assert gpu_deepspeed.within(0.0, 2**-8, 2**-7) and not gpu_deepspeed.within(0.0, 2**-6, 2**-7)
    assert gpu_deepspeed.within(100.0, 100.5, 2**-7) and not gpu_deepspeed.within(100.0, 101.0, 2**-7)
    assert not gpu_deepspeed.within(math.nan, math.nan, 1.0)


def test_a_resumed_step_that_differs_anywhere_is_named():
    step = {"tracker": [0.1, 0.9], "bundle_ids": [0, 1], "completion_ids": [[5]], "advantages": [0.5, -0.5]}
    full = {3: step, 4: step}
    assert steps_differing(full, {3: dict(step), 4: dict(step)}, (3, 4)) == []
    for key in ("tracker", "bundle_ids", "completion_ids", "advantages"):
        changed = {**step, key: [0]}
        assert steps_differing(full, {3: step, 4: changed}, (3, 4)) == [f"step 4: {key}"]
    assert steps_differing(full, {3: step}, (3, 4)) == ["step 4: not recorded"]


def test_the_first_step_metrics_are_those_logged_for_step_one():
    history = [
        {"step": 1, "loss": 0.5, "grad_norm": 2.0, "entropy": 11.0, "learning_rate": 1e-5},
        {"step": 2, "loss": 0.7, "grad_norm": 3.0, "entropy": 10.0},
        {"step": 2, "train_runtime": 1.0},
    ]
    assert first_step_metrics(history) == {"loss": 0.5, "grad_norm": 2.0, "entropy": 11.0}
