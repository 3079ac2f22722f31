"""Smoke test: every benchmark's code path runs at a minimal size, so the benchmarks cannot silently rot."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from benchmarks import advantage_throughput, overhead


def test_advantage_throughput_tiny(tmp_path):
    payload = advantage_throughput.main(
        ["--sizes", "800", "1600", "--repeats", "2", "--warmup", "1", "--profile", "800", "--out", str(tmp_path)]
    )
    assert [row["completions"] for row in payload["results"]] == [800, 1600]
    assert all(row["total_ms"] > 0 for row in payload["results"])
    assert "bundles: keys.argsort(dim=1)" in payload["line_profile_ms"]
    assert (tmp_path / "advantage_throughput.md").exists()
    with pytest.raises(ValueError, match="multiple of num_generations"):
        advantage_throughput.time_size(801, 16, 5, repeats=1, warmup=0, device="cpu")


def test_overhead_worker_one_step(tmp_path, tiny_model_dir):
    out = tmp_path / "run.json"
    args = [
        "--model",
        tiny_model_dir,
        "--steps",
        "2",
        "--warmup",
        "1",
        "--max-completion-length",
        "4",
        "--num-generations",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    for trainer in overhead.TRAINERS:
        result = overhead.main([*args, "--worker", trainer, "--worker-out", str(out)])
        assert len(result["step_times_s"]) == len(result["step_cpu_times_s"]) == 2 and result["peak_rss_mib"] > 0
        assert result["median_after_scoring_cpu_s"] > 0  # reward function's return to the batch observer
        assert json.loads(out.read_text())["trainer"] == trainer
    assert overhead.abba_order(2) == ["grpo", "riskpo", "riskpo", "grpo"]


@pytest.mark.slow
def test_tabular_study_smoke_and_cache(tmp_path):
    from benchmarks import tabular_study

    payload = tabular_study.main(["--smoke", "--out", str(tmp_path)])
    cfg = tabular_study.TabularConfig().scaled_down()
    methods = payload["methods"]
    assert {"grpo", "riskpo", "risk_seeking"} <= set(methods)
    assert len(payload["cells"]) == len(methods) * len(cfg.prompts_per_step) * len(cfg.learning_rates)
    for cell in payload["cells"].values():
        curve = [cell[f"pass@{k}"][0] for k in cfg.ks]
        assert all(0.0 <= p <= 1.0 for p in curve) and curve == sorted(curve)  # Pass@k never falls with k
        assert math.isfinite(cell["entropy"][0]) and cell["entropy"][0] > 0
    # Proposition 1 is a first-order identity: at a small step the prediction must match the measured change.
    for per_method in payload["proposition1"].values():
        for result in per_method.values():
            assert result["etas"]["0.01"]["relative_error"] < 0.05
    assert all(g["snr"] > 0 for g in payload["gradient_diagnostics"].values())
    assert all((tmp_path / name).exists() for name in payload["figures"])

    # A rerun reads finished runs from their JSON instead of training again: a marked cache entry shows up.
    run = tmp_path / "runs" / f"{tabular_study.run_name('grpo', 10, 0.1, 0)}.json"
    cached = json.loads(run.read_text())
    cached["final"]["pass@1"] = 0.123456
    run.write_text(json.dumps(cached))
    again = tabular_study.main(["--smoke", "--out", str(tmp_path)])
    assert again["cells"]["grpo|10|0.1"]["pass@1"][0] == pytest.approx(0.123456)
    # The report alone reads the same cache and trains nothing; a run missing from the cache is named.
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    report = tabular_study.main(["--smoke", "--out", str(tmp_path), "--report-only"])
    assert report["cells"] == again["cells"]
    run.unlink()
    with pytest.raises(FileNotFoundError, match=run.name):
        tabular_study.main(["--smoke", "--out", str(tmp_path), "--report-only"])
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")} == {
        p: t for p, t in stamps.items() if p != run
    }


@pytest.mark.slow
def test_tabular_baseline_cells_smoke_and_cache(tmp_path):
    from benchmarks import tabular_baseline

    payload = tabular_baseline.main(["--smoke", "--out", str(tmp_path)])
    cfg = tabular_baseline.TabularBaselineConfig().scaled_down()
    assert len(payload["cells"]) == len(tabular_baseline.cells(cfg)) == 3 * 4  # adam, sgd and an added sgd rate
    # The SGD choice is given within the grid fixed before the runs and with the rates added after.
    assert payload["selected_lr"]["sgd|riskpo_loo|10"] == 1.0
    assert payload["selected_lr"]["sgd+added|riskpo_loo|10"] in (1.0, 3.0)
    sgd = tmp_path / "runs" / tabular_baseline.run_file("sgd", "riskpo_loo", 10, 1.0, 0)
    assert json.loads(sgd.read_text())["optimizer"] == "sgd"
    # SGD keeps the advantage's scale, Adam does not: the two runs of one method differ.
    assert payload["cells"]["sgd|riskpo_loo|10|1"]["pass@1"] != payload["cells"]["adam|riskpo_loo|10|0.1"]["pass@1"]
    cached = json.loads(sgd.read_text())
    cached["final"]["pass@1"] = 0.123456
    sgd.write_text(json.dumps(cached))
    again = tabular_baseline.main(["--smoke", "--out", str(tmp_path)])
    assert again["cells"]["sgd|riskpo_loo|10|1"]["pass@1"][0] == pytest.approx(0.123456)


def test_tabular_start_policy_spreads_difficulty():
    from benchmarks import tabular_study

    cfg = tabular_study.TabularConfig()
    theta, start_p = tabular_study.starting_logits(cfg)
    assert torch.allclose(torch.softmax(theta, dim=1)[:, 0], start_p)
    assert start_p.min() < 0.01 and start_p.max() > 0.9  # some questions almost never solved at the start
    advantage = tabular_study.AdvantageFn("grpo", cfg, seed=0)
    adv = advantage(torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0] * 5, dtype=torch.float64))
    assert torch.allclose(adv.view(-1, 8).sum(1), torch.zeros(5, dtype=torch.float64), atol=1e-9)


@pytest.mark.slow
def test_lm_study_smoke_and_cache(tmp_path):
    from benchmarks.lm_study import config, run, short_protocol

    payload = short_protocol.main(["--smoke", "--out", str(tmp_path), "--workers", "1"])
    cfg = config.LMConfig().scaled_down()
    methods = list(config.METHODS)
    assert set(payload["chosen_lr"]) == set(methods) and not payload["not_finished"]
    for method, row in payload["methods"].items():
        assert row["seeds"] == list(cfg.test_seeds)
        for bucket in ["all"] + [f"{d}digit" for d in cfg.digits]:
            assert all(0.0 <= row[f"{bucket}/pass@{k}"][0] <= 1.0 for k in cfg.ks)
    result = json.loads((tmp_path / "runs" / f"{run.run_name('riskpo', 1e-4, 0)}.json").read_text())
    assert len(result["curves"]["reward"]) == len(result["curves"]["lower_rvar"]) == cfg.generation_batches
    assert len(result["curves"]["entropy"]) == cfg.generation_batches * cfg.updates_per_generation
    assert result["curves"]["logprob_adv_corr"] and all(math.isfinite(v) for v in result["curves"]["logprob_adv_cov"])
    assert (tmp_path / "lm_training_curves.png").exists() and (tmp_path / "lm_pass_at_k_by_difficulty.png").exists()
    diagnostics = payload["gradient_diagnostics"]["methods"]
    assert set(diagnostics) == set(methods) - {"gspo"}  # GSPO's advantage is GRPO's
    assert all(math.isfinite(d["snr"]) and 0 <= d["fraction_positive_advantage"] <= 1 for d in diagnostics.values())
    assert diagnostics["riskpo"]["fraction_positive_advantage"] == 0.0  # the paper's MVaR advantage is never > 0

    # A rerun trains nothing: every run is read back from its JSON.
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    short_protocol.main(["--smoke", "--out", str(tmp_path), "--workers", "1"])
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")} == stamps


def test_lm_study_task_and_configs(tmp_path):
    from benchmarks.lm_study import config, run, task

    cfg = config.LMConfig()
    splits = task.make_splits(cfg)
    for d in cfg.digits:
        held_out = set(splits.val[d]) | set(splits.test[d])
        assert not held_out & set(splits.train[d]) and not set(splits.val[d]) & set(splits.test[d])
        assert all(len(str(a)) == len(str(b)) == d for a, b in splits.test[d])
    assert not set(task.sft_pairs(replace(cfg, split_seed=0), splits, 200)) & {
        p for split in (splits.val, splits.test) for pairs in split.values() for p in pairs
    }
    # Identical compute: every method gets the same generation batch, updates and sampling.
    configs = {m: run.rl_config(m, 1e-4, 0, cfg, tmp_path) for m in config.METHODS}
    for args in configs.values():
        assert args.steps_per_generation == cfg.updates_per_generation == 4
        assert args.per_device_train_batch_size * args.steps_per_generation == 160 and args.temperature == 0.8
    assert configs["grpo"].importance_sampling_level == "token" and configs["grpo"].loss_type == "dapo"
    assert configs["gspo"].importance_sampling_level == configs["riskpo"].importance_sampling_level == "sequence"
    assert configs["gspo"].loss_type == configs["riskpo"].loss_type == "grpo"
    assert configs["risk_seeking"].risk_profile == "risk_seeking"
    # The long protocol changes the horizon, the grid and the evaluation sizes only: same task, model, batches.
    long_cfg = config.LongProtocol().lm
    assert long_cfg.generation_batches == 10 * cfg.generation_batches and len(long_cfg.learning_rates) >= 2
    for field in (
        "hidden_size",
        "num_layers",
        "digits",
        "split_seed",
        "sft_lr",
        "sft_max_steps",
        "num_generations",
        "prompts_per_generation",
        "updates_per_generation",
        "temperature",
        "max_completion_length",
    ):
        assert getattr(long_cfg, field) == getattr(cfg, field), field


def test_batch_signals_on_a_degenerate_and_a_healthy_batch():
    from benchmarks.lm_study.run import batch_signals

    # Every completion of every prompt failed, every advantage negative (the paper's MVaR at a low-success start).
    degenerate = batch_signals(torch.zeros(8), torch.full((8,), -0.5), num_generations=4)
    assert degenerate["frac_negative_advantage"] == 1.0 and degenerate["frac_prompts_all_wrong"] == 1.0
    assert degenerate["reward_advantage_corr"] is None  # no variance in either: no correlation to report
    healthy = batch_signals(torch.tensor([1.0, 0, 1, 0, 1, 1, 0, 0]), torch.tensor([1.0, -1, 1, -1, 1, 1, -1, -1]), 4)
    assert healthy["frac_negative_advantage"] == healthy["frac_positive_advantage"] == 0.5
    assert healthy["reward_advantage_corr"] == pytest.approx(1.0)
    assert healthy["frac_prompts_all_wrong"] == healthy["frac_prompts_all_right"] == 0.0


@pytest.mark.slow
def test_long_protocol_smoke_resumes_from_its_cache(tmp_path):
    from benchmarks.lm_study import config, long_protocol

    argv = ["--smoke", "--out", str(tmp_path), "--workers", "1", "--methods", "grpo", "riskpo"]
    payload = long_protocol.main(argv)
    protocol = config.LongProtocol().scaled_down()
    for start in protocol.starts:
        assert (tmp_path / start / "start_eval.json").exists()
        names = {p.stem for p in (tmp_path / start / "runs").glob("*.json")}
        grid = {f"{m}-lr{lr:g}-seed0" for m in ("grpo", "riskpo") for lr in protocol.lm.learning_rates}
        assert grid <= names, (start, names)
    moderate = json.loads((tmp_path / "moderate" / "sft_summary.json").read_text())
    assert moderate["extra_steps"] == protocol.moderate_max_steps and moderate["reached_target"] is False
    result = json.loads((tmp_path / "low" / "runs" / "riskpo-lr0.0001-seed0.json").read_text())
    assert [e["generation_batch"] for e in result["tracked"]] == list(
        range(protocol.eval_every, protocol.lm.generation_batches + 1, protocol.eval_every)
    )
    tracked = result["tracked"][-1]["val"]
    assert all(tracked[b]["entropy"] >= 0 for b in ("2digit", "3digit", "4digit", "all"))
    assert len(result["test"]["2digit"]["counts"]) == protocol.lm.num_test_per_bucket
    assert len(result["batch_signals"]) == protocol.lm.generation_batches
    assert {"q_alpha", "q_beta", "frac_negative_advantage"} <= set(result["batch_signals"][0])
    assert all(payload["starts"][s]["finished"] for s in protocol.starts)

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")}
    long_protocol.main(argv)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")} == stamps


@pytest.mark.slow
def test_exact_protocol_smoke_resumes_from_its_cache(tmp_path):
    from benchmarks.lm_study import config, exact_protocol, plans

    argv = ["--smoke", "--out", str(tmp_path), "--workers", "0"]
    payload = exact_protocol.main(argv)
    protocol = config.ExactProtocol().scaled_down()
    jobs = plans.exact_runs(protocol)
    assert payload["runs_finished"] == payload["runs_total"] == len(jobs) == 8
    # whatever finishes first forms paired comparisons: every method of a seed before the next seed
    assert [(j.start, j.seed) for j in jobs[:2]] == [("moderate", 0)] * 2
    result = json.loads(plans.run_path(tmp_path, jobs[0]).read_text())
    assert {len(result["test_p"][f"{d}digit"]) for d in protocol.lm.digits} == {protocol.lm.num_test_per_bucket}
    assert all(0.0 <= p <= 1.0 for ps in result["test_p"].values() for p in ps)
    assert result["eval_seed"] == config.run_eval_seed("moderate", jobs[0].method, 0)
    assert result["eval_seed"] != json.loads(plans.run_path(tmp_path, jobs[1]).read_text())["eval_seed"]
    assert [e["generation_batch"] for e in result["tracked"]] == list(range(1, protocol.lm.generation_batches + 1))
    rows = payload["starts"]["moderate"]["claims"]
    assert len(rows) == len(config.EXACT_CLAIMS)
    assert all(r["verdict"].startswith(("pending", "supported", "contradicted", "not significant")) for r in rows)
    assert "8 of 8 runs finished" in (tmp_path / "lm_exact.md").read_text()
    assert payload["figure"] and (tmp_path / payload["figure"]).exists()

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")}
    exact_protocol.main(argv)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")} == stamps


@pytest.mark.slow
def test_baseline_protocol_smoke_resumes_and_reports_partial_data_as_pending(tmp_path):
    from benchmarks.lm_study import baseline_protocol, config, plans

    argv = ["--smoke", "--out", str(tmp_path), "--workers", "0"]
    payload = baseline_protocol.main(argv)
    protocol = config.BaselineProtocol().scaled_down()
    jobs = plans.baseline_runs(protocol, tmp_path, tmp_path)
    assert payload["runs_finished"] == payload["runs_named"] == len(jobs)
    # The grid comes first, from both starts; then the chosen rate's other seeds; the control; the references.
    grid = len(protocol.exact.starts) * len(protocol.learning_rates)
    assert {(j.method, j.seed) for j in jobs[:grid]} == {("riskpo_loo", 0)}
    chosen = {s: plans.baseline_chosen_lr(protocol, tmp_path, tmp_path, s) for s in protocol.exact.starts}
    assert all(lr in protocol.learning_rates for lr in chosen.values())
    loo = [j for j in jobs if j.method == "riskpo_loo" and j.seed != 0]
    assert {(j.start, j.lr) for j in loo} == set(chosen.items())
    control = [j for j in jobs if j.start == "low" and j.method == "grpo" and j.lr == chosen["low"]]
    assert len(control) == len(protocol.exact.seeds)
    result = json.loads(plans.baseline_path(protocol, tmp_path, tmp_path, loo[0]).read_text())
    assert result["method"] == "riskpo_loo" and result["lr"] == chosen[loo[0].start]
    rows = payload["starts"]["low"]["claims"]
    assert [r["claim"] for r in rows] == [c.label for c in config.BASELINE_CLAIMS]
    assert all(r["verdict"].startswith(("supported", "contradicted", "not significant")) for r in rows)
    assert payload["default"]["default"] in ("none", "loo")
    assert payload["figure"] and (tmp_path / payload["figure"]).exists()

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")}
    baseline_protocol.main(argv)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json")} == stamps

    # With a run missing, rows rest on fewer seeds and no default is given.
    plans.baseline_path(protocol, tmp_path, tmp_path, loo[-1]).unlink()
    partial = baseline_protocol.main([*argv, "--report-only"])
    assert partial["default"]["default"] == "pending"
    assert partial["runs_finished"] == partial["runs_named"] - 1
    text = (tmp_path / "lm_baseline.md").read_text()
    assert "Default: pending" in text and "interim (1 of 2 seeds)" in text
