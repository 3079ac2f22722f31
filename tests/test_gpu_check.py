"""The prepared GPU check and its wheels, rehearsed on CPU: the dry run end to end, the parts that decide what is
compared and what is skipped, and the wheel folder's size guard."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from benchmarks import gpu_check, gpu_wheels, overhead, pair_design
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
def test_the_dry_run_runs_every_in_process_part_and_writes_dry_run_files(tmp_path):
    # A generous budget: on a loaded machine the default one would rightly skip parts; skipping has its own test.
    in_process = ["risk_math", "training", "loss", "lora", "performance"]
    report = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "900", "--parts", *in_process])
    verdicts = {name: gpu_check.verdict(part) for name, part in report["parts"].items()}
    assert verdicts == {**dict.fromkeys(in_process, "pass"), "deepspeed": "skipped: not asked for (--parts)"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check_dry_run.json", "gpu_check_dry_run.md"]
    assert "DRY RUN" in (tmp_path / "gpu_check_dry_run.md").read_text()
    written = json.loads((tmp_path / "gpu_check_dry_run.json").read_text())
    assert written["dry_run"] is True and written["environment"]["pins"]["trl"]["accepted"]
    risk = written["parts"]["risk_math"]
    assert risk["batches_compared"] == 4 * risk["combinations"] > 100
    training = written["parts"]["training"]
    assert training["mixed_precision"] == "bf16" and not training["resumed_steps_differing"]
    lora = written["parts"]["lora"]
    assert lora["only_lora_parameters_trainable"] and lora["adapter_saved_in_checkpoint"]
    assert lora["mixed_precision"] == "bf16" and not lora["resumed_steps_differing"]
    performance = written["parts"]["performance"]
    result = performance["results"]["tiny, gradient checkpointing off"]
    first = result["summary"]
    pairs = gpu_check.PERF_PAIRS["dry_run"]  # the two pilot pairs' spread asks at least 3, the dry run's most
    assert first["sizing"]["pilot_pairs"] == gpu_check.PERF_PILOT_PAIRS["dry_run"]
    assert first["pairs_done"] == pairs and len(first["step_time_s"]["pair_ratios"]) == pairs
    after_scoring = first["riskpo_added_per_step"]["after_scoring_s"]  # both trainers, from the public seams
    assert after_scoring["grpo"] > 0 and after_scoring["riskpo"] > 0 and first["completion_tokens_per_s"]["grpo"] > 0
    # The design: every completion has the fixed length, and the optimisation phase is timed on its own.
    assert {run["mean_completion_length"] for run in result["runs"]} == {gpu_check.PERF_LENGTH["dry_run"]}
    for run in result["runs"]:
        assert len(run["optimisation_times_s"]) == len(run["step_times_s"])
        assert all(0 < o < s for o, s in zip(run["optimisation_times_s"], run["step_times_s"]))
    for measure in ("step_time_s", "optimisation_time_s"):
        interval = result["resolution"][measure]
        assert interval["pairs"] == pairs and interval["low"] < interval["ratio"] < interval["high"]
        assert interval["pairs_needed"] == pair_design.pairs_needed(interval["spread"])


@pytest.mark.slow
@pytest.mark.distributed
def test_the_deepspeed_dry_run_compares_zero2_and_zero3_with_the_plain_run_and_resumes_exactly(tmp_path):
    # accelerate launch with the recipes' ZeRO configs on the CPU (gloo, fp32), the tiny model, 2 steps per run.
    pytest.importorskip("deepspeed")
    report = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "1500", "--parts", "deepspeed"])
    result = report["parts"]["deepspeed"]
    assert gpu_check.verdict(result) == "pass", result
    assert result["zero_stages"] == {
        "plain-grpo": None,
        "plain-riskpo": None,
        "zero2-grpo": 2,
        "zero2-riskpo": 2,
        "zero3-grpo": 3,
        "zero3-riskpo": 3,
        "zero3-riskpo-resumed": 3,
    }
    assert set(result["first_step_against_plain"]) == {"zero2-grpo", "zero2-riskpo", "zero3-grpo", "zero3-riskpo"}
    for compared in result["first_step_against_plain"].values():
        assert compared["same_completions"] and compared["figures"]["grad_norm"]["plain"] > 0
    assert result["zero3_resume"] == {"steps_compared": [2], "differing": []}
    assert result["optimizers"] == ["torch.optim.adamw.AdamW"]
    assert "| zero3-riskpo | 3 |" in (tmp_path / "gpu_check_dry_run.md").read_text()


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
    for name in (
        "riskpo_trl-",
        "trl-1.16.0-",
        "datasets-5.2.0-",
        "math_verify-",
        "latex2sympy2_extended-",
        "deepspeed-0.19.8-py3-none-any",
        "hjson-",
        "pydantic-",
    ):
        assert name in carried
    [deepspeed] = (tmp_path / "whl").glob("deepspeed-*.whl")
    assert gpu_wheels.deepspeed_wheel_problem(deepspeed) is None  # no compiled file, no op built, for CUDA
    assert not any(
        name.startswith(("torch-", "transformers-", "numpy-", "pyarrow-"))
        for name in summary["carried"] + summary["fallbacks"]
    )
    assert summary["size_mib"] + summary["tree_mib"] < 64


def fake_deepspeed_wheel(folder, name="deepspeed-0.19.8-py3-none-any.whl", ops=None, accelerator="cuda", extra=()):
    import zipfile

    ops = ops if ops is not None else {"fused_adam": False, "cpu_adam": False}
    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "deepspeed/git_version_info_installed.py",
            f"version='0.19.8'\ninstalled_ops={ops!r}\naccelerator_name={accelerator!r}\n",
        )
        for member in extra:
            archive.writestr(member, b"")
    return path


def test_a_deepspeed_wheel_with_a_compiled_op_or_for_another_accelerator_is_refused(tmp_path):
    assert gpu_wheels.deepspeed_wheel_problem(fake_deepspeed_wheel(tmp_path)) is None
    built = fake_deepspeed_wheel(tmp_path, name="a-py3-none-any.whl", ops={"fused_adam": True, "cpu_adam": False})
    assert gpu_wheels.deepspeed_wheel_problem(built) == "says these ops were built: fused_adam"
    shared = fake_deepspeed_wheel(tmp_path, name="b-py3-none-any.whl", extra=["deepspeed/ops/adam.so"])
    assert "holds compiled files (deepspeed/ops/adam.so)" in gpu_wheels.deepspeed_wheel_problem(shared)
    platform = fake_deepspeed_wheel(tmp_path, name="deepspeed-0.19.8-cp312-cp312-linux_x86_64.whl")
    assert "holds compiled files" in gpu_wheels.deepspeed_wheel_problem(platform)
    cpu = fake_deepspeed_wheel(tmp_path, name="c-py3-none-any.whl", accelerator="cpu")
    assert gpu_wheels.deepspeed_wheel_problem(cpu) == "was built for the accelerator 'cpu', not 'cuda'"


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
    for name in ("risk_math", "training", "lora", "deepspeed", "performance"):
        assert report["parts"][name] == {"skipped": "not asked for (--parts)"}
    assert "| risk math | skipped: not asked for (--parts) |" in (tmp_path / "gpu_check_dry_run.md").read_text()


def test_the_performance_part_runs_only_the_checkpointing_settings_asked_for(tmp_path, monkeypatch):
    settings = []

    def fake(*args, checkpointing_settings, models, pairs):
        settings.append((checkpointing_settings, pairs))
        return {"ok": True, "results": {}}

    monkeypatch.setattr(gpu_check, "run_performance", fake)
    gpu_check.main(["--dry-run", "--out", str(tmp_path), "--parts", "performance", "--gradient-checkpointing", "on"])
    gpu_check.main(["--dry-run", "--out", str(tmp_path), "--parts", "performance", "--perf-pairs", "7"])
    assert settings == [((True,), None), ((False,), 7)]


def test_each_part_stops_in_time_for_the_minimum_of_the_parts_after_it():
    minimum = gpu_check.PART_MINIMUM_S
    deadlines = gpu_check.part_deadlines(["risk_math", "deepspeed", "performance"], 1000.0)
    assert deadlines == {
        "risk_math": 1000.0 - minimum["deepspeed"] - minimum["performance"],
        "deepspeed": 1000.0 - minimum["performance"],
        "performance": 1000.0,
    }


def test_the_gpu_budget_and_the_machines_start_fit_in_twelve_minutes():
    # Start and install as measured on 2026-11-27 (45 s and 10 s), doubled for DeepSpeed's wheel and a margin.
    assert gpu_check.BUDGET_S["gpu"] + 2 * (45 + 10) < 12 * 60
    assert sum(gpu_check.PART_MINIMUM_S.values()) < gpu_check.BUDGET_S["gpu"]


def test_the_pilot_pairs_spread_sizes_the_rest_and_a_wider_spread_runs_more(monkeypatch, tmp_path):
    def fake_runs(riskpo_steps):
        steps = iter(riskpo_steps)

        def run(args, trainer, model, output_dir):
            step = 1.0 if trainer == "grpo" else next(steps)
            return {
                "trainer": trainer,
                "median_step_s": step,
                "median_optimisation_s": step,
                "median_step_cpu_s": 1.0,
                "peak_rss_mib": 1.0,
            }

        return run

    def pairs_run(riskpo_steps):
        monkeypatch.setattr(overhead, "run_in_process", fake_runs(riskpo_steps))
        args = overhead.parse_args(["--in-process", "--pairs", "40", "--size-after", "2"])
        runs, _, stopped, sizing = overhead.run_pairs(args, "model", str(tmp_path))
        assert stopped is None and sizing["pilot_pairs"] == 2
        assert len(runs) // 2 == sizing["pairs_wanted"] == min(40, sizing["pairs_needed"])
        return sizing

    narrow = pairs_run([1.010, 1.012] + [1.011] * 80)
    wide = pairs_run([1.00, 1.06] + [1.03] * 80)
    assert narrow["pairs_needed"] == pair_design.pairs_needed(max(narrow["pilot_spreads"].values())) == 3
    assert wide["pairs_needed"] == pair_design.pairs_needed(math.log(1.06) / math.sqrt(2)) > 10
    assert wide["pairs_wanted"] > narrow["pairs_wanted"]
