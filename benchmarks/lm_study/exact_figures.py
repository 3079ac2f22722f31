"""Figures of the exact protocol from the cached runs: exact test Pass@k against k (1..1,024) per method with the
start, and the gap to GRPO against k with its two-level 95% bootstrap band."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks._common import save_figure

from .config import METHOD_LABELS, ExactProtocol
from .exact import pass_at_k, probs_matrix
from .stats import two_level_bootstrap


def figure(
    protocol: ExactProtocol,
    out: Path,
    runs_by_start: dict,
    start_evals: dict,
    buckets: list[str],
    against_grpo: tuple[str, ...] = ("riskpo", "gspo", "riskpo_authors"),
    name: str = "lm_exact_pass_at_k.png",
) -> str | None:
    """Write ``out/<name>``: Pass@k of every method in ``runs_by_start`` (one colour each, in ``protocol.methods``
    order), and each of ``against_grpo`` minus GRPO; return its name, or None when no run has finished."""
    starts = [s for s in protocol.starts if s in start_evals and any(runs_by_start[s].values())]
    if not starts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.unique(np.geomspace(1, protocol.max_k, 40).round().astype(int))
    band_ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if k <= protocol.max_k]
    fig, axes = plt.subplots(2, len(starts), figsize=(6 * len(starts), 8), squeeze=False)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {method: cycle[i % len(cycle)] for i, method in enumerate(protocol.methods)}  # one per method, both rows
    for col, start in enumerate(starts):
        runs = runs_by_start[start]
        start_p = probs_matrix([start_evals[start]["test_p"]], buckets)
        top, bottom = axes[0][col], axes[1][col]
        top.plot(ks, [pass_at_k(start_p, k).mean() for k in ks], "k--", label="start")
        for method, method_runs in runs.items():
            if not method_runs:
                continue
            p = probs_matrix([r["test_p"] for r in method_runs], buckets)
            top.plot(
                ks,
                [pass_at_k(p, k).mean() for k in ks],
                color=colors[method],
                label=f"{METHOD_LABELS[method]} ({len(method_runs)})",
            )
        top.set(xscale="log", xlabel="k", ylabel="exact test Pass@k (mean over seeds)", title=f"{start} start")
        top.legend(fontsize=8)
        for method in against_grpo:
            if not runs.get(method) or not runs.get("grpo"):
                continue
            a = probs_matrix([r["test_p"] for r in runs[method]], buckets)
            b = probs_matrix([r["test_p"] for r in runs["grpo"]], buckets)
            cells = [
                two_level_bootstrap(pass_at_k(a, k), pass_at_k(b, k), resamples=2000, seed=protocol.bootstrap_seed)
                for k in band_ks
            ]
            bottom.plot(
                band_ks,
                [c.estimate for c in cells],
                marker="o",
                color=colors[method],
                label=f"{METHOD_LABELS[method]} minus GRPO",
            )
            bottom.fill_between(
                band_ks, [c.low for c in cells], [c.high for c in cells], alpha=0.2, color=colors[method]
            )
        bottom.axhline(0, color="k", lw=0.8)
        bottom.set(
            xscale="log",
            xlabel="k",
            ylabel="difference of exact test Pass@k",
            title="gap to GRPO, 95% two-level bootstrap band (2,000 resamples)",
        )
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=8)
    save_figure(fig, out / name, dpi=110)
    return name
