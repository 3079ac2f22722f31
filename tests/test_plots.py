"""riskpo-plot: runs overlaid per panel, missing metrics skipped with a note, Pass@k and log-prob figures."""

from __future__ import annotations

import json

import pytest

from riskpo_trl.evaluation.diagnostics import logprob_by_reward_rate
from riskpo_trl.evaluation.plots import load_run, plot_training_curves, series, smooth
from riskpo_trl.scripts.plot import main


def write_state(folder, log_history):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": len(log_history), "log_history": log_history})
    )
    return folder


def riskpo_history(steps=6):
    history = [
        {
            "step": s,
            "entropy": 1.0 - 0.05 * s,
            "reward": 0.1 * s,
            "risk/lower_rvar": 0.5 + 0.1 * s,
            "risk/mvar": 1.0 + 0.1 * s,
            "risk/q_alpha": 1.0,
            "risk/q_beta": 3.0,
        }
        for s in range(1, steps + 1)
    ]
    history.insert(0, {"step": 0, "eval/pass@1": 0.2, "eval/pass@4": 0.5, "eval/avg@4": 0.2})
    history.append({"step": steps, "eval/pass@1": 0.4, "eval/pass@4": 0.7, "eval/avg@4": 0.4})
    return history


def grpo_history(steps=6):
    return [
        {"step": s, "entropy": 1.0 - 0.1 * s, "reward": 0.08 * s, "risk/mvar": float("nan") if s == 1 else None}
        for s in range(1, steps + 1)
    ]


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
    write_state(tmp_path / "grpo-run" / "checkpoint-6", grpo_history())  # found through its checkpoint
    eval_a = write_results(tmp_path / "a.json", {1: 0.3, 2: 0.45, 4: 0.6})
    eval_b = write_results(tmp_path / "b.json", {1: 0.35, 2: 0.5, 4: 0.55})
    paths = main(
        [
            "curves",
            f"RiskPO={riskpo}",
            str(tmp_path / "grpo-run"),
            "--eval",
            f"RiskPO={eval_a}",
            f"grpo-run={eval_b}",
            "--smoothing",
            "0.5",
            "--output",
            str(tmp_path / "fig" / "curves"),
        ]
    )
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.stat().st_size > 1000 for p in paths)
    out = capsys.readouterr().out
    for panel in ("Lower-tail RVaR", "MVaR objective", "Tracked quantiles", "Held-out Pass@k during training"):
        assert f"'{panel}': not logged by grpo-run" in out  # the run name comes from the folder above checkpoint-6
    assert load_run(str(tmp_path / "grpo-run")).name == "grpo-run"


def test_eval_takes_several_files_after_one_flag_or_repeated():
    from riskpo_trl.scripts.plot import build_parser

    def eval_results(*argv):
        return build_parser().parse_args(["curves", "A=runs/a", "B=runs/b", *argv]).eval_results

    assert eval_results("--eval", "A=a.json", "B=b.json") == ["A=a.json", "B=b.json"]
    assert eval_results("--eval", "A=a.json", "--eval", "B=b.json") == ["A=a.json", "B=b.json"]
    assert eval_results("--eval", "A=a.json", "B=b.json", "--eval", "Base=c.json", "--smoothing", "0.5") == [
        "A=a.json",
        "B=b.json",
        "Base=c.json",
    ]
    assert eval_results() == []


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
    assert [(b.low, b.num_questions, b.mean_logprob) for b in bins] == [
        (0.0, 1, -2.5),
        (0.25, 1, -2.0),
        (0.75, 1, -0.5),
    ]
    assert bins[1].sem_logprob == 0.0 and bins[0].sem_logprob > 0
    with pytest.raises(ValueError, match="--logprobs true"):
        logprob_by_reward_rate([{"scores": [1], "mean_logprobs": None}])

    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"truncated by a cra')
    paths = main(["logprob", f"RiskPO={samples}", "--bins", "4", "--output", str(tmp_path / "lp")])
    assert paths[0].exists() and paths[1].exists()


# --- what the axes show (their properties and data, not pixels) -------------------------------------------------


def panel(fig, title):
    [ax] = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def test_an_unnamed_eval_result_is_the_run_it_belongs_to(tmp_path):
    from riskpo_trl.evaluation.plots import draw_training_curves

    run = load_run(str(write_state(tmp_path / "riskpo-run", riskpo_history())))
    (tmp_path / "eval" / "somewhere").mkdir(parents=True)
    result = write_results(tmp_path / "eval" / "somewhere" / "results.json", {1: 0.3, 4: 0.6})
    fig, _ = draw_training_curves([run], [str(result)])
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == ["riskpo-run"]  # one run, one colour: the result is that run's
    [line] = panel(fig, "Pass@k (average)").get_lines()
    [run_line] = panel(fig, "Mean reward").get_lines()
    assert line.get_color() == run_line.get_color()
    assert list(line.get_xdata()) == [1, 4] and list(line.get_ydata()) == [0.3, 0.6]

    fig, _ = draw_training_curves([run], [f"Base={result}", str(result)])  # a named baseline keeps its own colour
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["riskpo-run", "Base"]


def test_unnamed_eval_results_among_several_runs_must_be_named(tmp_path):
    runs = [load_run(str(write_state(tmp_path / name, riskpo_history()))) for name in ("riskpo", "grpo")]
    (tmp_path / "eval" / "riskpo").mkdir(parents=True)
    (tmp_path / "eval" / "other").mkdir(parents=True)
    matching = write_results(tmp_path / "eval" / "riskpo" / "results.json", {1: 0.3})
    unmatched = write_results(tmp_path / "eval" / "other" / "results.json", {1: 0.3})
    plot_training_curves(runs, tmp_path / "ok", [str(matching)])  # the folder names the run
    with pytest.raises(ValueError, match=rf"--eval {unmatched}: which run .* e\.g\. --eval riskpo={unmatched}"):
        plot_training_curves(runs, tmp_path / "x", [str(unmatched)])
    with pytest.raises(ValueError, match=r"labelled \['riskpo'\]; give each its own NAME="):
        plot_training_curves(runs, tmp_path / "x", [str(matching), f"riskpo={unmatched}"])


def test_a_flat_entropy_line_is_drawn_flat_without_an_offset(tmp_path):
    from riskpo_trl.evaluation.plots import draw_training_curves

    history = [{"step": s, "entropy": 4.591 + 0.0001 * (s % 3), "reward": 0.1 * s} for s in range(1, 9)]
    fig, _ = draw_training_curves([load_run(str(write_state(tmp_path / "run", history)))])
    fig.canvas.draw()  # tick labels and offsets are set at draw time
    for ax in fig.axes:
        if ax.get_visible():
            assert not ax.yaxis.get_major_formatter().get_useOffset(), ax.get_title()
            assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()
    entropy = panel(fig, "Policy entropy")
    low, high = entropy.get_ylim()
    assert high - low >= 0.02 * 4.5912  # swings of 0.0002 on 4.591 stay flat
    assert list(entropy.get_lines()[0].get_ydata()) == [entry["entropy"] for entry in history]
    reward = panel(fig, "Mean reward")
    assert reward.get_ylim()[1] - reward.get_ylim()[0] < 1.0  # a real change still fills the panel


def test_every_training_panel_shares_one_step_axis(tmp_path):
    """A metric logged on some steps only (mvar on steps 1-2, reward on 1-4) is drawn on the same step range."""
    from riskpo_trl.evaluation.plots import draw_training_curves

    history = [{"step": s, "reward": 0.1 * s, **({"risk/mvar": 0.5} if s <= 2 else {})} for s in range(1, 5)]
    fig, _ = draw_training_curves([load_run(str(write_state(tmp_path / "run", history)))])
    reward, mvar = panel(fig, "Mean reward"), panel(fig, "MVaR objective")
    assert mvar.get_xlim() == reward.get_xlim() and reward.get_xlim()[0] < 1 and reward.get_xlim()[1] > 4


def test_logprob_points_sit_at_the_questions_reward_rate(tmp_path, capsys):
    from riskpo_trl.evaluation.plots import draw_logprob_diagnostic

    all_wrong = tmp_path / "base" / "samples.jsonl"
    all_wrong.parent.mkdir()
    all_wrong.write_text(
        "".join(json.dumps({"scores": [0, 0], "mean_logprobs": [-1.0 - i, -2.0]}) + "\n" for i in range(3))
    )
    fig, notes = draw_logprob_diagnostic([f"Base={all_wrong}"], num_bins=5)
    [errorbar] = fig.axes[0].containers
    assert list(errorbar.lines[0].get_xdata()) == [0.0]  # not the bin's centre, 0.1
    assert notes == [
        "Base: every question has reward rate 0, so its one point cannot show confidence against difficulty"
    ]
    main(["logprob", f"Base={all_wrong}", "--output", str(tmp_path / "lp")])
    assert "note: Base: every question has reward rate 0" in capsys.readouterr().out

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        json.dumps({"scores": [1, 0, 0, 0], "mean_logprobs": [-1.0] * 4})
        + "\n"
        + json.dumps({"scores": [1, 1, 0, 0], "mean_logprobs": [-0.5] * 4})
        + "\n"
    )
    fig, notes = draw_logprob_diagnostic([str(mixed)], num_bins=2)
    assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == [0.25, 0.5] and notes == []
