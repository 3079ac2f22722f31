"""Figures of the long-horizon protocol: validation entropy against updates, trajectories in the (Pass@1, Pass@64)
plane, and the final test Pass@k curves per bucket, one row per start, at each method's chosen learning rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common import headless_pyplot, save_figure

from .config import METHOD_LABELS, LongProtocol

PANELS = ("all", "2digit", "3digit", "4digit")
FigureInputs = dict[str, tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]  # start -> (start eval, runs)


def _tracked(runs: list[dict[str, Any]], bucket: str, key: str):
    """Mean and std over seeds of a tracked validation value, with update 0 left to the caller."""
    import numpy as np

    length = min(len(r["tracked"]) for r in runs)
    values = np.array([[e["val"][bucket][key] for e in r["tracked"][:length]] for r in runs], dtype=float)
    updates = [e["update"] for e in runs[0]["tracked"][:length]]
    return updates, values.mean(0), values.std(0)


def plot_entropy(protocol: LongProtocol, inputs: FigureInputs, out: Path) -> Path:
    plt = headless_pyplot()
    fig, axes = plt.subplots(len(inputs), len(PANELS), figsize=(3.6 * len(PANELS), 3.0 * len(inputs)), squeeze=False)
    for row, (start, (start_eval, by_method)) in enumerate(inputs.items()):
        for ax, bucket in zip(axes[row], PANELS):
            for m, rs in by_method.items():
                if not rs or not all(r["tracked"] for r in rs):
                    continue
                x, mean, std = _tracked(rs, bucket, "entropy")
                x, mean, std = [0, *x], [start_eval["val"][bucket]["entropy"], *mean], [0.0, *std]
                (line,) = ax.plot(x, mean, label=f"{METHOD_LABELS[m]} (lr {rs[0]['lr']:g}, {len(rs)} seeds)")
                ax.fill_between(
                    x,
                    [a - b for a, b in zip(mean, std)],
                    [a + b for a, b in zip(mean, std)],
                    color=line.get_color(),
                    alpha=0.15,
                )
            ax.set_title(f"{start} start, validation {bucket}", fontsize=9)
            ax.set_xlabel("updates")
        axes[row][0].set_ylabel("token entropy of the sampler")
    axes[0][0].legend(fontsize=6)
    return save_figure(fig, out / "lm_long_entropy.png")


def plot_trajectories(protocol: LongProtocol, inputs: FigureInputs, out: Path) -> Path:
    plt = headless_pyplot()
    top = f"pass@{protocol.track_samples}"
    fig, axes = plt.subplots(1, len(inputs), figsize=(4.6 * len(inputs), 4.0), squeeze=False)
    for ax, (start, (start_eval, by_method)) in zip(axes[0], inputs.items()):
        origin = start_eval["val"]["all"]
        ax.plot([origin["pass@1"]], [origin[top]], "k*", markersize=10, label="start")
        for m, rs in by_method.items():
            if not rs or not all(r["tracked"] for r in rs):
                continue
            _, p1, _ = _tracked(rs, "all", "pass@1")
            _, cover, _ = _tracked(rs, "all", top)
            (line,) = ax.plot(
                [origin["pass@1"], *p1], [origin[top], *cover], marker=".", markersize=3, label=METHOD_LABELS[m]
            )
            ax.plot([p1[-1]], [cover[-1]], "o", color=line.get_color())  # where it ends
        ax.set_xlabel("validation Pass@1 (all buckets)")
        ax.set_ylabel(f"validation Pass@{protocol.track_samples}")
        ax.set_title(f"{start} start: trajectories (mean over seeds; dot = end)", fontsize=9)
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, out / "lm_long_trajectories.png")


def plot_pass_at_k(protocol: LongProtocol, inputs: FigureInputs, out: Path) -> Path:
    import numpy as np

    plt = headless_pyplot()
    ks = [k for k in protocol.lm.ks if k <= protocol.lm.eval_samples]
    fig, axes = plt.subplots(
        len(inputs), len(PANELS), figsize=(3.6 * len(PANELS), 3.0 * len(inputs)), squeeze=False, sharey="row"
    )
    for row, (start, (start_eval, by_method)) in enumerate(inputs.items()):
        for ax, bucket in zip(axes[row], PANELS):
            ax.plot(ks, [start_eval["test"][bucket][f"pass@{k}"] for k in ks], "k--", label="start")
            for m, rs in by_method.items():
                if not rs:
                    continue
                values = np.array([[r["test"][bucket][f"pass@{k}"] for k in ks] for r in rs])
                (line,) = ax.plot(ks, values.mean(0), label=METHOD_LABELS[m])
                ax.fill_between(
                    ks,
                    values.mean(0) - values.std(0),
                    values.mean(0) + values.std(0),
                    color=line.get_color(),
                    alpha=0.15,
                )
            ax.set_xscale("log", base=2)
            ax.set_title(f"{start} start, test {bucket}", fontsize=9)
            ax.set_xlabel("k")
        axes[row][0].set_ylabel("Pass@k")
    axes[0][0].legend(fontsize=6)
    return save_figure(fig, out / "lm_long_pass_at_k.png")


def plot_all(protocol: LongProtocol, inputs: FigureInputs, out: Path) -> list[Path]:
    inputs = {s: v for s, v in inputs.items() if v[1]}
    if not inputs:
        return []
    return [
        plot_entropy(protocol, inputs, out),
        plot_trajectories(protocol, inputs, out),
        plot_pass_at_k(protocol, inputs, out),
    ]
