"""The prepared GPU check and its wheels, rehearsed on CPU: the dry run end to end, the parts that decide what is
compared and what is skipped, and the wheel folder's size guard."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from benchmarks import gpu_check, gpu_wheels, overhead
from riskpo_trl.risk import (
    ADVANTAGE_BASELINES,
    ADVANTAGE_SCALINGS,
    BUNDLINGS,
    CREDIT_ASSIGNMENTS,
    QUANTILE_SOURCES,
    RISK_PROFILES,
    RiskEstimator,
)
from riskpo_trl.tiny_model import build_char_tokenizer


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_writes_dry_run_files(tmp_path):
    # A generous budget: on a loaded machine the default one would rightly skip parts; skipping has its own test.
    report = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "900"])
    assert {name: gpu_check.verdict(part) for name, part in report["parts"].items()} == dict.fromkeys(
        ("risk_math", "training", "loss", "performance"), "pass"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check_dry_run.json", "gpu_check_dry_run.md"]
    assert "DRY RUN" in (tmp_path / "gpu_check_dry_run.md").read_text()
    written = json.loads((tmp_path / "gpu_check_dry_run.json").read_text())
    assert written["dry_run"] is True and written["environment"]["pins"]["trl"]["accepted"]
    risk = written["parts"]["risk_math"]
    assert risk["batches_compared"] == 4 * risk["combinations"] > 100
    training = written["parts"]["training"]
    assert training["mixed_precision"] == "bf16" and not training["resumed_steps_differing"]
    performance = written["parts"]["performance"]["results"]
    first = performance["tiny, gradient checkpointing off"]["summary"]
    assert first["pairs_done"] == 5 and len(first["step_time_s"]["pair_ratios"]) == 5
    after_scoring = first["riskpo_added_per_step"]["after_scoring_s"]  # both trainers, from the public seams
    assert after_scoring["grpo"] > 0 and after_scoring["riskpo"] > 0 and first["completion_tokens_per_s"]["grpo"] > 0


def test_the_risk_math_grid_covers_every_registry_the_estimator_takes():
    choices, grid = gpu_check.estimator_grid()
    registries = (
        BUNDLINGS,
        RISK_PROFILES,
        ADVANTAGE_SCALINGS,
        QUANTILE_SOURCES,
        CREDIT_ASSIGNMENTS,
        ADVANTAGE_BASELINES,
    )
    for registry in registries:
        assert choices[registry.field] == list(registry)
    assert choices["natural_baseline"] == [True, False]
    assert len(grid) == len({tuple(c.items()) for c in grid}) == math.prod(len(v) for v in choices.values())


def test_the_risk_math_check_reports_a_device_that_disagrees(monkeypatch):
    few = [dict(zip(("risk_profile", "quantile_source"), c)) for c in (("mvar", "tracked"), ("rvar", "group"))]
    monkeypatch.setattr(gpu_check, "estimator_grid", lambda: ({}, few))
    assert gpu_check.check_risk_math("cpu")["ok"]

    original_step = RiskEstimator.step
    calls = []

    def off_every_other_call(self, rewards, **kwargs):
        batch = original_step(self, rewards, **kwargs)
        calls.append(1)
        if len(calls) % 2 == 0:  # the second estimator of each pair stands for a device that rounds differently
            batch.advantages = batch.advantages + 1e-4
        return batch

    monkeypatch.setattr(RiskEstimator, "step", off_every_other_call)
    result = gpu_check.check_risk_math("cpu")
    assert not result["ok"] and result["largest_difference"]["advantages"] == pytest.approx(1e-4, rel=1e-2)
    assert "advantages differ" in result["mismatches"][0]


def test_differences_treat_matching_nans_as_equal_and_anything_else_as_infinite():
    nan = float("nan")
    assert gpu_check.largest_difference(torch.tensor([1.0, nan]), torch.tensor([1.0, nan])) == 0
    assert gpu_check.largest_difference(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0])) == float("inf")
    assert gpu_check.largest_difference({"a": 1.0}, {"b": 1.0}) == float("inf")
    assert gpu_check.largest_difference({"a": 1.0, "b": nan}, {"a": 1.5, "b": nan}) == 0.5
    assert gpu_check.largest_difference(torch.tensor([100.0]), torch.tensor([100.01])) == pytest.approx(1e-4, rel=1e-3)


def test_a_part_the_budget_cannot_hold_is_skipped_and_a_failing_part_is_recorded():
    report = {"parts": {}}
    gpu_check.run_part(report, "loss", time.time() + 5, lambda: {"ok": True})
    assert report["parts"]["loss"]["skipped"].startswith("5 s of the budget left")

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    gpu_check.run_part(report, "risk_math", time.time() + 100, broken)
    assert (
        gpu_check.verdict(report["parts"]["risk_math"]) == "ERROR: RuntimeError: CUDA error: an illegal memory "
        "access was encountered"
    )


def test_versions_are_placed_against_the_tested_releases():
    assert gpu_check.tested_position("5.23.0", "4.56.2", "5.23.0") == "5.23.0: a tested release"
    assert "between the tested releases" in gpu_check.tested_position("5.17.0", "4.56.2", "5.23.0")
    assert "outside" in gpu_check.tested_position("4.50.0", "4.56.2", "5.23.0")


def test_pair_ratios_pair_consecutive_runs():
    runs = [{"trainer": t, "x": x} for t, x in [("grpo", 1.0), ("riskpo", 2.0), ("riskpo", 3.0), ("grpo", 1.0)]]
    summary = overhead.ratio_summary(runs, "x")
    assert summary["pair_ratios"] == [2.0, 3.0] and summary["median_pair_ratio"] == 2.5
    assert summary["ratio"] == 2.5  # medians 2.5 / 1.0


def test_a_padded_tokenizer_decodes_every_id_and_encodes_as_before():
    plain, padded = build_char_tokenizer(), build_char_tokenizer(vocab_size=70_000)
    assert len(padded) == 70_000
    assert padded("What is 12 + 5?")["input_ids"] == plain("What is 12 + 5?")["input_ids"]
    assert isinstance(padded.decode([69_999, 300, 5]), str)
    with pytest.raises(ValueError, match="smaller than the"):
        build_char_tokenizer(vocab_size=10)


def test_the_wheel_folder_must_leave_room_for_the_working_tree(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"0" * (3 * gpu_wheels.MIB))
    assert gpu_wheels.check_size(tmp_path, tree_bytes=60 * gpu_wheels.MIB) == 3 * gpu_wheels.MIB
    with pytest.raises(SystemExit, match=r"holds 3.0 MiB.*already takes 62.0 MiB of it, leaving 2.0 MiB"):
        gpu_wheels.check_size(tmp_path, tree_bytes=62 * gpu_wheels.MIB)


@pytest.mark.slow
def test_the_wheels_for_the_gpu_machine_fit_beside_the_working_tree(tmp_path):
    # Downloads from PyPI (a few MiB): the folder a lent GPU machine installs from, without a network.
    summary = gpu_wheels.build(tmp_path / "whl")
    carried = " ".join(summary["carried"])
    for name in ("riskpo_trl-", "trl-1.16.0-", "datasets-5.2.0-", "math_verify-", "latex2sympy2_extended-"):
        assert name in carried
    assert not any(
        name.startswith(("torch-", "transformers-", "numpy-", "pyarrow-"))
        for name in summary["carried"] + summary["fallbacks"]
    )
    assert summary["size_mib"] + summary["tree_mib"] < 64


def test_the_qwen_sizes_give_the_parameter_counts_the_model_cards_state():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    counts = {}
    for name, sizes in gpu_check.QWEN25_SIZES.items():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**sizes))
        counts[name] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    assert counts == {"Qwen2.5-0.5B": 0.49, "Qwen2.5-1.5B": 1.54}  # "0.49B" and "1.54B" on the Qwen2.5 model cards


def test_parts_not_asked_for_are_named_as_such_and_not_run(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_check, "check_risk_math", lambda device: ran.append("risk_math") or {"ok": True})
    report = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--parts", "loss"])
    assert ran == [] and gpu_check.verdict(report["parts"]["loss"]) == "pass"
    for name in ("risk_math", "training", "performance"):
        assert report["parts"][name] == {"skipped": "not asked for (--parts)"}
    assert "| risk math | skipped: not asked for (--parts) |" in (tmp_path / "gpu_check_dry_run.md").read_text()


def test_the_performance_part_runs_only_the_checkpointing_settings_asked_for(tmp_path, monkeypatch):
    settings = []
    monkeypatch.setattr(
        gpu_check, "run_performance", lambda *args: settings.append(args[-1]) or {"ok": True, "results": {}}
    )
    gpu_check.main(["--dry-run", "--out", str(tmp_path), "--parts", "performance", "--gradient-checkpointing", "on"])
    assert settings == [(True,)]
