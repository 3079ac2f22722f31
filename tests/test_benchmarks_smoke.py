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
        assert ("median_riskpo_added_cpu_s" in result) == (trainer == "riskpo")
        assert json.loads(out.read_text())["trainer"] == trainer
    assert overhead.abba_order(2) == ["grpo", "riskpo", "riskpo", "grpo"]


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
    from benchmarks import lm_study

    payload = lm_study.main(["--smoke", "--out", str(tmp_path), "--workers", "1"])
    cfg = lm_study.LMConfig().scaled_down()
    methods = [m for m in lm_study.METHODS if lm_study.method_available(m)]
    assert set(payload["chosen_lr"]) == set(methods) and not payload["not_finished"]
    for method, row in payload["methods"].items():
        assert row["seeds"] == list(cfg.test_seeds)
        for bucket in ["all"] + [f"{d}digit" for d in cfg.digits]:
            assert all(0.0 <= row[f"{bucket}/pass@{k}"][0] <= 1.0 for k in cfg.ks)
    run = json.loads((tmp_path / "runs" / f"{lm_study.run_name('riskpo', 1e-4, 0)}.json").read_text())
    assert len(run["curves"]["reward"]) == len(run["curves"]["lower_rvar"]) == cfg.generation_batches
    assert len(run["curves"]["entropy"]) == cfg.generation_batches * cfg.updates_per_generation
    assert run["curves"]["logprob_adv_corr"] and all(math.isfinite(v) for v in run["curves"]["logprob_adv_cov"])
    assert (tmp_path / "lm_training_curves.png").exists() and (tmp_path / "lm_pass_at_k_by_difficulty.png").exists()
    diagnostics = payload["gradient_diagnostics"]["methods"]
    assert set(diagnostics) == set(methods) - {"gspo"}  # GSPO's advantage is GRPO's
    assert all(math.isfinite(d["snr"]) and 0 <= d["fraction_positive_advantage"] <= 1 for d in diagnostics.values())
    assert diagnostics["riskpo"]["fraction_positive_advantage"] == 0.0  # the paper's MVaR advantage is never > 0

    # A rerun trains nothing: every run is read back from its JSON.
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    lm_study.main(["--smoke", "--out", str(tmp_path), "--workers", "1"])
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")} == stamps


def test_lm_study_task_and_configs(tmp_path):
    from benchmarks import lm_study

    cfg = lm_study.LMConfig()
    splits = lm_study.make_splits(cfg)
    for d in cfg.digits:
        held_out = set(splits.val[d]) | set(splits.test[d])
        assert not held_out & set(splits.train[d]) and not set(splits.val[d]) & set(splits.test[d])
        assert all(len(str(a)) == len(str(b)) == d for a, b in splits.test[d])
    assert not set(lm_study.sft_pairs(replace(cfg, split_seed=0), splits, 200)) & {
        p for split in (splits.val, splits.test) for pairs in split.values() for p in pairs
    }
    # Identical compute: every method gets the same generation batch, updates and sampling.
    methods = [m for m in lm_study.METHODS if lm_study.method_available(m)]
    configs = {m: lm_study.rl_config(m, 1e-4, 0, cfg, tmp_path) for m in methods}
    for args in configs.values():
        assert args.steps_per_generation == cfg.updates_per_generation == 4
        assert args.per_device_train_batch_size * args.steps_per_generation == 160 and args.temperature == 0.8
    assert configs["grpo"].importance_sampling_level == "token" and configs["grpo"].loss_type == "dapo"
    assert configs["gspo"].importance_sampling_level == configs["riskpo"].importance_sampling_level == "sequence"
    assert configs["gspo"].loss_type == configs["riskpo"].loss_type == "grpo"
    assert configs["risk_seeking"].risk_profile == "risk_seeking"
