"""Figures like the paper's: training curves of several runs side by side, Pass@k curves, the log-prob diagnostic.

Command line (``riskpo-plot`` or ``python -m riskpo_trl.scripts.plot``)::

    riskpo-plot curves RiskPO=outputs/riskpo GRPO=outputs/grpo --eval RiskPO=eval/riskpo/results.json \
        --eval GRPO=eval/grpo/results.json --output figures/training_curves
    riskpo-plot logprob Base=eval/base/samples.jsonl RiskPO=eval/riskpo/samples.jsonl --output figures/logprob

A run is a training output directory (its ``trainer_state.json``, or that of its latest ``checkpoint-*``) or a
``trainer_state.json`` path, optionally prefixed by ``NAME=`` for the legend. Each figure is written as PNG and PDF.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .diagnostics import logprob_by_reward_rate, read_samples

EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    keys: tuple[str, ...]  # log_history keys drawn in this panel; several keys get different line styles
    key_labels: tuple[str, ...] = ()


# The paper's training-dynamics panels. risk/* values are on the bundle-score scale (sum of bundle_size rewards).
TRAINING_PANELS = (
    Panel("Policy entropy", "mean token entropy (nats)", ("entropy",)),
    Panel("Lower-tail RVaR", "mean bundle score at or below $q_\\alpha$", ("risk/lower_rvar",)),
    Panel("MVaR objective", "MVaR of bundle scores", ("risk/mvar",)),
    Panel("Mean reward", "mean reward per completion", ("reward",)),
    Panel("Tracked quantiles", "bundle score", ("risk/q_alpha", "risk/q_beta"), ("$q_\\alpha$", "$q_\\beta$")),
)
LINE_STYLES = ("-", "--", ":", "-.")


@dataclass
class Run:
    name: str
    log_history: list[dict[str, Any]]


# --- loading -------------------------------------------------------------------------------------------------------


def _split_name(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition("=")
    return (name, path) if sep and name and not Path(spec).exists() else (None, spec)


def find_trainer_state(path: str | Path) -> Path:
    """``path`` itself if it is a file, else its ``trainer_state.json`` or that of its latest checkpoint."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / "trainer_state.json").is_file():
        return path / "trainer_state.json"
    checkpoints = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if checkpoints:
        return checkpoints[-1]
    raise FileNotFoundError(
        f"No trainer_state.json in {str(path)!r} or its checkpoint-* folders. Pass a training output_dir saved with "
        "trainer.save_state() (or checkpoints), or the trainer_state.json file itself."
    )


def load_run(spec: str) -> Run:
    """A run from ``[NAME=]PATH``; the name defaults to the directory name."""
    name, path = _split_name(spec)
    state_path = find_trainer_state(path)
    state = json.loads(state_path.read_text())
    if name is None:
        folder = state_path.parent
        name = folder.parent.name if folder.name.startswith("checkpoint-") else folder.name
    return Run(name, state.get("log_history", []))


def series(log_history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` in a log history; non-finite values (and ``None``) are dropped."""
    steps, values = [], []
    for entry in log_history:
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(entry.get("step", len(steps)))
            values.append(float(value))
    return steps, values


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's debiasing; ``weight=0`` returns the values unchanged."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight {weight} must be in [0, 1).")
    out, average = [], 0.0
    for i, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i) if weight else value)
    return out


# --- figures -------------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _grid(plt, num_panels: int, columns: int):
    columns = min(columns, num_panels)
    rows = math.ceil(num_panels / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.7 * rows + 0.5), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[num_panels:]:
        ax.set_visible(False)
    return fig, flat[:num_panels]


def _step_range(runs: Sequence[Run]) -> tuple[float, float]:
    """The training panels' shared x range: every step any run logged, with matplotlib's default 5% margins."""
    steps = [entry["step"] for run in runs for entry in run.log_history if isinstance(entry.get("step"), (int, float))]
    low, high = (min(steps), max(steps)) if steps else (0, 1)
    margin = 0.05 * (high - low) if high > low else 0.5
    return low - margin, high + margin


def _save(fig, output: str | Path) -> list[Path]:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    stem = output.with_suffix("") if output.suffix in (".png", ".pdf") else output
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    return paths


# A panel's y range covers at least this fraction of its largest |value|: a line that changes by less is drawn flat.
MIN_RELATIVE_Y_SPAN = 0.02


def _plain_y_axis(ax, values: Sequence[float]) -> None:
    """Tick labels that read as the values themselves, and no zoom into noise. Without this, matplotlib shows a line
    flat at 4.591 as ticks 0.0000-0.0003 under an offset '+4.591': a flat line that looks like large swings."""
    ax.ticklabel_format(axis="y", useOffset=False)
    if not values:
        return
    low, high = min(values), max(values)
    min_span = MIN_RELATIVE_Y_SPAN * max(abs(low), abs(high))
    if high - low < min_span:
        middle = (low + high) / 2
        ax.set_ylim(middle - min_span / 2, middle + min_span / 2)


def pass_at_k_training_panel(runs: Sequence[Run]) -> Panel | None:
    """Pass@k over training steps, for the k's the :class:`PassAtKCallback` logged (smallest and largest k)."""
    ks = sorted(
        {
            int(key.split("@")[1])
            for run in runs
            for entry in run.log_history
            for key in entry
            if key.startswith(f"{EVAL_PREFIX}pass@")
        }
    )
    if not ks:
        return None
    chosen = [ks[0]] if len(ks) == 1 else [ks[0], ks[-1]]
    return Panel(
        "Held-out Pass@k during training",
        "Pass@k",
        tuple(f"{EVAL_PREFIX}pass@{k}" for k in chosen),
        tuple(f"Pass@{k}" for k in chosen),
    )


def eval_result_name(spec: str, run_names: Sequence[str] = ()) -> tuple[str, str]:
    """(legend name, path) of an ``--eval [NAME=]results.json``. Without ``NAME=`` a result belongs to a run: the only
    run, or the run named like the result's folder (``eval/riskpo/results.json`` and run ``riskpo``); otherwise it
    must be named. A ``NAME`` that is no run's (``Base=``) is drawn as a curve of its own."""
    name, path = _split_name(spec)
    if name:
        return name, path
    folder = Path(path).parent.name
    if not run_names:
        return folder, path
    if len(run_names) == 1:
        return run_names[0], path
    if folder in run_names:
        return folder, path
    raise ValueError(
        f"--eval {spec}: which run is this result of? Its folder {folder!r} is not one of the runs {list(run_names)}. "
        f"Name it, e.g. --eval {run_names[0]}={spec}; a name that is no run's (e.g. Base={spec}) draws it as a curve "
        "of its own."
    )


def load_pass_at_k_curve(
    spec: str, benchmark: str = "average", run_names: Sequence[str] = ()
) -> tuple[str, dict[int, float]]:
    """(name, {k: Pass@k}) from an evaluator ``results.json``, for one benchmark or the average over benchmarks; the
    name as :func:`eval_result_name` gives it."""
    name, path = eval_result_name(spec, run_names)
    results = json.loads(Path(path).read_text())
    if benchmark == "average":
        metrics = results.get("average", {})
    else:
        if benchmark not in results.get("benchmarks", {}):
            raise ValueError(f"{path} has no benchmark {benchmark!r}; it has {sorted(results.get('benchmarks', {}))}.")
        metrics = results["benchmarks"][benchmark].get("metrics", {})
    curve = {int(key.split("@")[1]): value for key, value in metrics.items() if key.startswith("pass@")}
    return name, dict(sorted(curve.items()))


def plot_training_curves(
    runs: Sequence[Run],
    output: str | Path,
    eval_results: Sequence[str] = (),
    benchmark: str = "average",
    smoothing: float = 0.0,
    columns: int = 3,
    title: str | None = None,
) -> tuple[list[Path], list[str]]:
    """Draw the paper's panels with every run overlaid (:func:`draw_training_curves`) and save them as PNG and PDF;
    returns the written files and notes on skipped metrics."""
    fig, notes = draw_training_curves(runs, eval_results, benchmark, smoothing, columns, title)
    paths = _save(fig, output)
    _pyplot().close(fig)
    return paths, notes


def draw_training_curves(
    runs: Sequence[Run],
    eval_results: Sequence[str] = (),
    benchmark: str = "average",
    smoothing: float = 0.0,
    columns: int = 3,
    title: str | None = None,
):
    """The figure of :func:`plot_training_curves`, not saved: ``(figure, notes)``."""
    if not runs:
        raise ValueError("plot_training_curves needs at least one run.")
    panels = list(TRAINING_PANELS)
    extra = pass_at_k_training_panel(runs)
    if extra is not None:
        panels.append(extra)
    notes: list[str] = []
    drawn: list[Panel] = []
    for panel in panels:
        have = [run.name for run in runs if any(series(run.log_history, key)[0] for key in panel.keys)]
        if not have:
            notes.append(f"skipped panel '{panel.title}': no run logged {', '.join(panel.keys)}")
            continue
        drawn.append(panel)
        missing = [run.name for run in runs if run.name not in have]
        if missing:
            notes.append(f"'{panel.title}': not logged by {', '.join(missing)}")
    curves = [load_pass_at_k_curve(spec, benchmark, [run.name for run in runs]) for spec in eval_results]
    names = [name for name, _ in curves]
    shared = sorted({name for name in names if names.count(name) > 1})
    if shared:
        raise ValueError(f"Several --eval results are labelled {shared}; give each its own NAME=.")
    curves = [(name, curve) for name, curve in curves if curve]
    if not drawn and not curves:
        raise ValueError(f"Nothing to plot: none of the runs logged any of {[p.keys for p in panels]}.")

    plt = _pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color_of = {run.name: colors[i % len(colors)] for i, run in enumerate(runs)}
    for i, (name, _) in enumerate(curves):
        color_of.setdefault(name, colors[(len(runs) + i) % len(colors)])
    fig, axes = _grid(plt, len(drawn) + bool(curves), columns)
    step_axis = _step_range(runs)

    for ax, panel in zip(axes, drawn):
        missing = []
        drawn_values: list[float] = []
        for run in runs:
            plotted = False
            for key, style in zip(panel.keys, LINE_STYLES):
                steps, values = series(run.log_history, key)
                if not steps:
                    continue
                plotted = True
                drawn_values += values
                if key.startswith(EVAL_PREFIX):  # sparse held-out evaluations: markers, never smoothed
                    ax.plot(steps, values, style, color=color_of[run.name], linewidth=1.5, marker="o", markersize=3)
                    continue
                if smoothing:
                    ax.plot(steps, values, style, color=color_of[run.name], alpha=0.2, linewidth=0.8)
                ax.plot(steps, smooth(values, smoothing), style, color=color_of[run.name], linewidth=1.5)
            if not plotted:
                missing.append(run.name)
        _plain_y_axis(ax, drawn_values)
        ax.set_xlim(*step_axis)  # one step axis for every panel, whatever steps its metric was logged at
        ax.set_title(panel.title)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if len(panel.keys) > 1:  # line styles tell the keys apart; colours tell the runs apart (figure legend)
            handles = [plt.Line2D([], [], color="0.3", linestyle=s) for s in LINE_STYLES[: len(panel.keys)]]
            ax.legend(handles, panel.key_labels or panel.keys, loc="best", frameon=False)
        if missing:
            ax.text(0.02, 0.02, f"not logged: {', '.join(missing)}", transform=ax.transAxes, fontsize=7, color="0.4")

    if curves:
        ax = axes[len(drawn)]
        for name, curve in curves:
            ax.plot(list(curve), list(curve.values()), "o-", color=color_of[name], linewidth=1.5, markersize=3)
        ax.set_xscale("log", base=2)
        ks = sorted({k for _, curve in curves for k in curve})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_title(f"Pass@k ({benchmark})")
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("Pass@k")
        ax.grid(alpha=0.3)

    handles = [plt.Line2D([], [], color=color, linewidth=2) for color in color_of.values()]
    top = 0.9 if title else 0.95
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.legend(
        handles,
        list(color_of),
        loc="lower center",
        ncol=min(len(handles), 6),
        frameon=False,
        bbox_to_anchor=(0.5, top),
    )
    if title:
        fig.suptitle(title, y=top + 0.06)
    return fig, notes


def plot_logprob_diagnostic(
    sample_files: Sequence[str], output: str | Path, num_bins: int = 5, notes: list[str] | None = None
) -> list[Path]:
    """Mean completion log-probability against the question's reward rate, one line per model (samples file), saved
    as PNG and PDF (:func:`draw_logprob_diagnostic`); its notes are appended to ``notes`` when given."""
    fig, drawn_notes = draw_logprob_diagnostic(sample_files, num_bins)
    if notes is not None:
        notes += drawn_notes
    paths = _save(fig, output)
    _pyplot().close(fig)
    return paths


def _has_logprobs(record: dict[str, Any]) -> bool:
    return any(lp is not None and math.isfinite(lp) for lp in record.get("mean_logprobs") or [])


def draw_logprob_diagnostic(sample_files: Sequence[str], num_bins: int = 5):
    """The figure of :func:`plot_logprob_diagnostic`, not saved: ``(figure, notes)``. Each point sits at the mean
    reward rate of its bin's questions; a model whose questions all share one reward rate (say every sample wrong)
    gets one point there and a note that the figure cannot compare easy with hard questions for it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    notes = []
    for spec in sample_files:
        name, path = _split_name(spec)
        name = name or Path(path).parent.name
        records = read_samples(path)
        bins = logprob_by_reward_rate(records, num_bins)
        ax.errorbar(
            [b.mean_reward_rate for b in bins],
            [b.mean_logprob for b in bins],
            yerr=[b.sem_logprob for b in bins],
            marker="o",
            capsize=2,
            linewidth=1.5,
            markersize=3,
            label=name,
        )
        rates = {sum(r["scores"]) / len(r["scores"]) for r in records if _has_logprobs(r)}
        if len(rates) == 1:
            notes.append(
                f"{name}: every question has reward rate {rates.pop():g}, so its one point cannot show "
                "confidence against difficulty"
            )
    ax.set_xlim(-0.05, 1.05)
    ax.set_xlabel("question reward rate (mean over its samples)")
    ax.set_ylabel("mean token log-prob of completions")
    ax.set_title("Confidence versus question difficulty")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    if notes:
        ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=6, color="0.4", wrap=True)
    fig.tight_layout()
    return fig, notes
