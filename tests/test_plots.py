"""riskpo-plot: runs overlaid per panel, missing metrics skipped with a note, Pass@k and log-prob figures."""

from __future__ import annotations

import json

import pytest

from riskpo_trl.evaluation.diagnostics import logprob_by_reward_rate
from riskpo_trl.evaluation.plots import load_run, plot_training_curves, series, smooth
from riskpo_trl.scripts.plot import main


def write_state(folder, log_history):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": len(log_history), "log_history": log_history}))
    return folder


def riskpo_history(steps=6):
    history = [{"step": s, "entropy": 1.0 - 0.05 * s, "reward": 0.1 * s, "risk/lower_rvar": 0.5 + 0.1 * s,
                "risk/mvar": 1.0 + 0.1 * s, "risk/q_alpha": 1.0, "risk/q_beta": 3.0} for s in range(1, steps + 1)]
    history.insert(0, {"step": 0, "eval/pass@1": 0.2, "eval/pass@4": 0.5, "eval/avg@4": 0.2})
    history.append({"step": steps, "eval/pass@1": 0.4, "eval/pass@4": 0.7, "eval/avg@4": 0.4})
    return history


def grpo_history(steps=6):
    return [{"step": s, "entropy": 1.0 - 0.1 * s, "reward": 0.08 * s, "risk/mvar": float("nan") if s == 1 else None}
            for s in range(1, steps + 1)]


def write_results(path, curve):
    metrics = {f"pass@{k}": v for k, v in curve.items()}
    path.write_text(json.dumps({"model": "m", "benchmarks": {"toy": {"metrics": metrics}}, "average": metrics}))
    return path


def test_series_drops_missing_and_nan_and_smooth_is_debiased():
    steps, values = series(grpo_history(), "risk/mvar")
    assert steps == [] and values == []
    assert series(riskpo_history(), "eval/pass@1") == ([0, 6], [0.2, 0.4])
    assert smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # constant in, constant out
    assert smooth([0.0, 2.0], 0.0) == [0.0, 2.0]
    with pytest.raises(ValueError):
        smooth([1.0], 1.0)


def test_curves_command_overlays_runs_and_notes_missing_metrics(tmp_path, capsys):
    riskpo = write_state(tmp_path / "riskpo-run", riskpo_history())
    grpo = write_state(tmp_path / "grpo-run" / "checkpoint-6", grpo_history())  # found through its checkpoint
    eval_a = write_results(tmp_path / "a.json", {1: 0.3, 2: 0.45, 4: 0.6})
    eval_b = write_results(tmp_path / "b.json", {1: 0.35, 2: 0.5, 4: 0.55})
    paths = main(["curves", f"RiskPO={riskpo}", str(tmp_path / "grpo-run"), "--eval", f"RiskPO={eval_a}",
                  "--eval", f"grpo-run={eval_b}", "--smoothing", "0.5", "--output", str(tmp_path / "fig" / "curves")])
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in paths)
    out = capsys.readouterr().out
    for panel in ("Lower-tail RVaR", "MVaR objective", "Tracked quantiles", "Held-out Pass@k during training"):
        assert f"'{panel}': not logged by grpo-run" in out  # the run name comes from the folder above checkpoint-6
    assert load_run(str(tmp_path / "grpo-run")).name == "grpo-run"


def test_grpo_only_skips_risk_panels(tmp_path):
    run = load_run(f"GRPO={write_state(tmp_path / 'g', grpo_history())}")
    paths, notes = plot_training_curves([run], tmp_path / "only-grpo")
    assert paths[0].exists()
    assert any(note.startswith("skipped panel 'MVaR objective'") for note in notes)
    assert not any("Policy entropy" in note for note in notes)


def test_bad_plot_inputs_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        load_run(str(tmp_path))
    empty = load_run(str(write_state(tmp_path / "empty", [{"step": 1, "loss": 0.3}])))
    with pytest.raises(ValueError, match="Nothing to plot"):
        plot_training_curves([empty], tmp_path / "x")


def test_logprob_by_reward_rate_bins_questions(tmp_path):
    records = [
        {"scores": [0, 0, 0, 0], "mean_logprobs": [-3.0, -3.0, -2.0, -2.0]},  # rate 0 -> bin [0, 0.25)
        {"scores": [1, 0, 0, 0], "mean_logprobs": [-2.0, -2.0, -2.0, -2.0]},  # rate 0.25 -> bin [0.25, 0.5)
        {"scores": [1, 1, 1, 1], "mean_logprobs": [-0.5, -0.5, -0.5, -0.5]},  # rate 1 -> last bin
    ]
    bins = logprob_by_reward_rate(records, num_bins=4)
    assert [(b.low, b.num_questions, b.mean_logprob) for b in bins] == [(0.0, 1, -2.5), (0.25, 1, -2.0), (0.75, 1, -0.5)]
    assert bins[1].sem_logprob == 0.0 and bins[0].sem_logprob > 0
    with pytest.raises(ValueError, match="--logprobs true"):
        logprob_by_reward_rate([{"scores": [1], "mean_logprobs": None}])

    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"truncated by a cra')
    paths = main(["logprob", f"RiskPO={samples}", "--bins", "4", "--output", str(tmp_path / "lp")])
    assert paths[0].exists() and paths[1].exists()
