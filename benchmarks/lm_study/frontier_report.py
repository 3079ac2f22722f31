"""The frontier study's report from whatever runs are cached: the learning-rate grid and its choice, the frontier
table (Pass@k at matched Pass@1, per method), the verdict per variant and start by ``FRONTIER_VERDICT_RULE``, the end
points (descriptive), a post hoc section (not pre-registered: the frontier past the interval and end-point differences,
with CIs), and the figure. Rows say how many seeds they rest on; rows on fewer than all seeds are interim.
Run it with ``python -m benchmarks.lm_study.frontier_protocol --report-only``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import json_exists, read_json, save_figure

from .config import METHOD_LABELS
from .exact import pass_at_k, probs_matrix
from .exact_report import machine_note, start_sections, write_report
from .frontier import arm_reaches, frontier_difference, margin_verdict, method_reaches, values_at_levels
from .frontier_config import (
    FRONTIER_DEFAULT_NOTE,
    FRONTIER_DEFINITION,
    FRONTIER_OUTCOMES,
    FRONTIER_RATE_RULE,
    FRONTIER_VERDICT_RULE,
    FrontierProtocol,
)
from .frontier_store import read_run
from .plans import Run, arms, chosen_lr, frontier_path, frontier_runs, grid_score
from .stats import two_level_bootstrap

NAME = "lm_frontier"
# Post hoc, chosen after the pre-registered verdicts were read: final-weight differences between two arms at the same
# rate, (arm, arm it is compared with). No rule applies to them.
POST_HOC_END_POINT_PAIRS = (
    (("riskpo_loo", 1e-5), ("riskpo", 1e-5)),
    (("riskpo_loo", 1e-5), ("grpo", 1e-5)),
    (("riskpo_authors", 1e-5), ("grpo", 1e-5)),
    (("riskpo", 1e-5), ("grpo", 1e-5)),
)
POST_HOC_NOTE = (
    "Chosen after the verdicts above were read: not pre-registered, no rule applies, no verdict is given. 95% "
    "two-level bootstrap CIs as for the verdicts (each arm's seeds resampled, then the test problems, paired)."
)


def buckets_of(protocol: FrontierProtocol) -> list[str]:
    return [f"{d}digit" for d in protocol.exact.lm.digits]


def trajectory(run: dict[str, Any], start_eval: dict[str, Any], buckets: list[str]) -> np.ndarray:
    """(checkpoints, problems) exact test success probabilities, checkpoint 0 the start's."""
    return probs_matrix([start_eval["test_p"], *(c["test_p"] for c in run["checkpoints"])], buckets)


def arm_values(runs: list[dict], start_eval: dict, buckets: list[str], k: int, levels) -> np.ndarray:
    """(seeds, levels, problems): each seed's per-problem Pass@k at each matched Pass@1 level (NaN: not reached)."""
    out = []
    for run in runs:
        p = trajectory(run, start_eval, buckets)
        out.append(values_at_levels(p.mean(axis=1), pass_at_k(p, k), np.asarray(levels)))
    return np.array(out)


def arm_runs(protocol: FrontierProtocol, out: Path, start: str, method: str, lr: float) -> list[dict[str, Any]]:
    """The finished comparison runs (the protocol's fresh seeds) of one arm, by seed."""
    found = [read_run(frontier_path(out, Run(start, method, lr, s))) for s in protocol.seeds]
    return [r for r in found if r is not None]


def final_probs(runs: list[dict[str, Any]], buckets: list[str]) -> np.ndarray:
    """(seeds, problems) exact test success probabilities of each run's final weights."""
    return probs_matrix([r["checkpoints"][-1]["test_p"] for r in runs], buckets)


def seeds_label(runs_by_arm: dict[tuple[str, float], list], method: str) -> str:
    return ", ".join(f"{lr:g}: {len(runs)}" for (m, lr), runs in runs_by_arm.items() if m == method)


@dataclass(frozen=True)
class FrontierStart:
    """What every section of one start's report reads: its evaluation, its comparison runs per arm and their values
    at the matched Pass@1 levels."""

    protocol: FrontierProtocol
    out: Path
    reference: Path
    start: str
    start_eval: dict[str, Any]
    buckets: list[str]
    start_p: np.ndarray
    levels: Any
    runs_by_arm: dict[tuple[str, float], list[dict[str, Any]]]
    methods: list[str]  # those with a finished comparison run
    values: dict[int, dict[tuple[str, float], np.ndarray]]  # k -> arm -> (seeds, levels, problems)

    @classmethod
    def load(
        cls, protocol: FrontierProtocol, out: Path, reference: Path, start: str, start_eval: dict
    ) -> FrontierStart:
        buckets = buckets_of(protocol)
        levels = protocol.pass1_levels(start)
        named = arms(protocol, out, reference, start)
        runs_by_arm = {arm: arm_runs(protocol, out, start, *arm) for arm in named}
        methods = [m for m in protocol.methods() if any(runs for (am, _), runs in runs_by_arm.items() if am == m)]
        values = {
            k: {arm: arm_values(runs, start_eval, buckets, k, levels) for arm, runs in runs_by_arm.items() if runs}
            for k in (protocol.primary_k, protocol.secondary_k)
        }
        start_p = probs_matrix([start_eval["test_p"]], buckets)
        return cls(protocol, out, reference, start, start_eval, buckets, start_p, levels, runs_by_arm, methods, values)


def grid_section(s: FrontierStart) -> tuple[list[str], dict[str, Any]]:
    """The grid and the choice (validation only)."""
    protocol = s.protocol
    lines = [
        (
            "### Learning rate of the paper's and the authors' advantage (seed "
            f"{protocol.grid_seed}, final exact validation criterion)"
        ),
        "",
        "| method | " + " | ".join(f"{lr:g}" for lr in protocol.grid_rates) + " | chosen |",
        "|---|" + "---|" * (len(protocol.grid_rates) + 1),
    ]
    grid: dict[str, Any] = {}
    for method in protocol.ruled_methods:
        scores = {lr: grid_score(protocol, s.out, s.reference, s.start, method, lr) for lr in protocol.grid_rates}
        lr = chosen_lr(protocol, s.out, s.reference, s.start, method)
        grid[method] = {"scores": {f"{r:g}": score for r, score in scores.items()}, "chosen": lr}
        lines.append(
            f"| {METHOD_LABELS[method]} | "
            + " | ".join("not finished" if score is None else f"{score:.4f}" for score in scores.values())
            + f" | {'pending' if lr is None else f'{lr:g}'} |"
        )
    lines.append("")
    return lines, grid


def frontier_section(s: FrontierStart) -> tuple[list[str], dict[int, Any]]:
    """The frontier table: each method's envelope of seed means over its rates, per level."""
    if not s.methods:
        return ["No comparison run has finished yet.", ""], {}
    lines: list[str] = []
    frontier: dict[int, Any] = {}
    for k, by_arm in s.values.items():
        lines += [
            (
                f"### Frontier: exact test Pass@{k} at matched test Pass@1 (seed mean; a method's best rate per "
                "level; '-': no rate of it reaches the level with every seed)"
            ),
            "",
            "| Pass@1 | "
            + " | ".join(f"{METHOD_LABELS[m]} ({seeds_label(s.runs_by_arm, m)})" for m in s.methods)
            + " |",
            "|---|" + "---|" * len(s.methods),
        ]
        table = {}
        for m in s.methods:
            arm_means = [
                np.where(arm_reaches(v), np.nan_to_num(v).mean(axis=(0, 2)), -np.inf)
                for (am, _), v in by_arm.items()
                if am == m
            ]
            best = np.max(arm_means, axis=0)
            table[m] = [None if not np.isfinite(x) else float(x) for x in best]
        for i, level in enumerate(s.levels):
            lines.append(
                f"| {level:.3f} | "
                + " | ".join("-" if table[m][i] is None else f"{table[m][i]:.4f}" for m in s.methods)
                + " |"
            )
        frontier[k] = table
        lines.append("")
    return lines, frontier


def verdict_row(s: FrontierStart, variant: str, k: int, role: str) -> dict[str, Any]:
    """One variant's verdict at Pass@``k`` against the reference method, by the rule (interim on fewer seeds)."""
    protocol = s.protocol
    var = [v for arm, v in s.values[k].items() if arm[0] == variant]
    ref = [v for arm, v in s.values[k].items() if arm[0] == protocol.reference]
    row: dict[str, Any] = {
        "variant": variant,
        "k": k,
        "role": role,
        "seeds": {f"{m} {lr:g}": len(r) for (m, lr), r in s.runs_by_arm.items() if m in (variant, protocol.reference)},
    }
    if not var or not ref:
        row["verdict"] = "pending: no finished run"
        return row
    kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
    diff = frontier_difference(var, ref, s.levels, **kwargs)
    row["difference"] = diff.as_dict()
    by_rule = margin_verdict(diff.low, diff.high, protocol.margin)
    expected_arms = 2 if variant in dict(protocol.fixed_arms) else 1
    counts = list(row["seeds"].values())
    complete = len(counts) == expected_arms + len(dict(protocol.fixed_arms)[protocol.reference]) and all(
        n == len(protocol.seeds) for n in counts
    )
    row["complete"] = complete
    row["verdict"] = (
        by_rule
        if complete
        else (f"interim ({min(counts)}-{max(counts)} of {len(protocol.seeds)} seeds per arm): {by_rule} so far")
    )
    return row


def verdict_section(s: FrontierStart) -> tuple[list[str], list[dict[str, Any]]]:
    """The verdicts, per variant and k."""
    protocol = s.protocol
    rows = [
        verdict_row(s, variant, k, role)
        for variant in protocol.variants
        for k, role in ((protocol.primary_k, "primary"), (protocol.secondary_k, "secondary"))
    ]
    lines = [
        (
            f"### Verdicts: variant minus {METHOD_LABELS[protocol.reference]}, mean over the matched Pass@1 levels "
            f"(margin ±{protocol.margin:g})"
        ),
        "",
        "| variant | outcome | seeds per arm | levels used | difference [95% two-level CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        seeds = ", ".join(f"{a}: {n}" for a, n in row["seeds"].items()) or "-"
        d = row.get("difference")
        if not d or d["estimate"] is None:
            lines.append(
                f"| {METHOD_LABELS[row['variant']]} | Pass@{row['k']} ({row['role']}) | {seeds} | - | - | "
                f"{row['verdict']} |"
            )
            continue
        used = d["levels"]
        clipped = "" if len(used) == len(s.levels) else " (clipped)"
        lines.append(
            f"| {METHOD_LABELS[row['variant']]} | Pass@{row['k']} ({row['role']}) | {seeds} | "
            f"[{used[0]:.3f}, {used[-1]:.3f}]{clipped} | {d['estimate']:+.4f} [{d['low']:+.4f}, "
            f"{d['high']:+.4f}] | {row['verdict']} |"
        )
    lines.append("")
    return lines, rows


def end_points_section(s: FrontierStart) -> tuple[list[str], dict[str, Any]]:
    """End points, descriptive."""
    ks = (1, s.protocol.primary_k, s.protocol.secondary_k)
    lines = [
        "### End points (final weights; descriptive only): seed mean of exact test Pass@k",
        "",
        "| arm (seeds) | " + " | ".join(f"Pass@{k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
        "| start | " + " | ".join(f"{pass_at_k(s.start_p, k).mean():.4f}" for k in ks) + " |",
    ]
    end_points: dict[str, Any] = {}
    for (m, lr), runs in s.runs_by_arm.items():
        if not runs:
            continue
        final = final_probs(runs, s.buckets)
        cells = [float(pass_at_k(final, k).mean()) for k in ks]
        end_points[f"{m} {lr:g}"] = dict(zip(ks, cells))
        lines.append(f"| {METHOD_LABELS[m]} at {lr:g} ({len(runs)}) | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    lines.append("")
    return lines, end_points


def levels_beyond(s: FrontierStart) -> np.ndarray:
    """The pre-registered grid continued above the interval, up to the highest Pass@1 every seed of some arm reaches."""
    step = s.protocol.pass1_step
    peaks = [
        min(trajectory(r, s.start_eval, s.buckets).mean(axis=1).max() for r in runs)
        for runs in s.runs_by_arm.values()
        if runs
    ]
    count = max(int(np.floor((max(peaks) - s.levels[-1]) / step + 1e-9)), 0) if peaks else 0  # no run: no level
    return np.round(s.levels[-1] + step * np.arange(1, count + 1), 6)


def beyond_interval_rows(s: FrontierStart) -> list[dict[str, Any]]:
    """Per variant and k: its frontier minus the reference's over the levels above the interval both reach."""
    protocol = s.protocol
    levels = levels_beyond(s)
    kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
    rows = []
    for k in (protocol.primary_k, protocol.secondary_k):
        values = {
            arm: arm_values(runs, s.start_eval, s.buckets, k, levels) for arm, runs in s.runs_by_arm.items() if runs
        }
        for variant in protocol.variants:
            var = [v for (m, _), v in values.items() if m == variant]
            ref = [v for (m, _), v in values.items() if m == protocol.reference]
            diff = frontier_difference(var, ref, levels, **kwargs) if var and ref and levels.size else None
            rows.append({"variant": variant, "k": k, "difference": diff.as_dict() if diff else None})
    return rows


def end_point_rows(s: FrontierStart) -> list[dict[str, Any]]:
    """Per pair of ``POST_HOC_END_POINT_PAIRS`` with runs: the final-weight difference at Pass@1, @64, @1024."""
    protocol = s.protocol
    kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
    rows = []
    for a, b in POST_HOC_END_POINT_PAIRS:
        runs_a, runs_b = s.runs_by_arm.get(a), s.runs_by_arm.get(b)
        if not runs_a or not runs_b:
            continue
        final_a, final_b = final_probs(runs_a, s.buckets), final_probs(runs_b, s.buckets)
        differences = {
            k: two_level_bootstrap(pass_at_k(final_a, k), pass_at_k(final_b, k), **kwargs).as_dict()
            for k in (1, protocol.primary_k, protocol.secondary_k)
        }
        rows.append({"arm": f"{a[0]} {a[1]:g}", "against": f"{b[0]} {b[1]:g}", "differences": differences})
    return rows


def fmt_difference(d: dict[str, Any]) -> str:
    return f"{d['estimate']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def post_hoc_section(s: FrontierStart) -> tuple[list[str], dict[str, Any]]:
    """Post hoc, descriptive: the frontier past the pre-registered interval, and end points at the same rate."""
    protocol = s.protocol
    beyond = beyond_interval_rows(s)
    lines = [
        "### Post hoc (not pre-registered, descriptive)",
        "",
        POST_HOC_NOTE,
        "",
        (
            f"Beyond the pre-registered interval: variant minus {METHOD_LABELS[protocol.reference]}, each at its "
            f"frontier, mean over the levels above the interval (step {protocol.pass1_step:g}, as inside it) that "
            "both reach with every seed of one of their rates."
        ),
        "",
        "| variant | outcome | levels used | difference [95% two-level CI] |",
        "|---|---|---|---|",
    ]
    for row in beyond:
        d = row["difference"]
        cells = (
            f"[{d['levels'][0]:.3f}, {d['levels'][-1]:.3f}] | {fmt_difference(d)}"
            if d and d["estimate"] is not None
            else "- | no common level above the interval"
        )
        lines.append(f"| {METHOD_LABELS[row['variant']]} | Pass@{row['k']} | {cells} |")
    ends = end_point_rows(s)
    ks = (1, protocol.primary_k, protocol.secondary_k)
    lines += [
        "",
        "End points at the same rate (final weights): arm minus arm, mean over seeds and test problems.",
        "",
        "| arm minus arm | " + " | ".join(f"Pass@{k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for row in ends:
        (a, lr_a), (b, lr_b) = (arm.split(" ") for arm in (row["arm"], row["against"]))
        lines.append(
            f"| {METHOD_LABELS[a]} at {lr_a} minus {METHOD_LABELS[b]} at {lr_b} | "
            + " | ".join(fmt_difference(row["differences"][k]) for k in ks)
            + " |"
        )
    lines.append("")
    return lines, {"note": POST_HOC_NOTE, "beyond_interval": beyond, "end_points": ends}


# A start's sections in report order, each with its payload key.
START_SECTIONS = (
    ("grid", grid_section),
    ("frontier", frontier_section),
    ("verdicts", verdict_section),
    ("end_points", end_points_section),
    ("post_hoc", post_hoc_section),
)


def start_section(protocol: FrontierProtocol, out: Path, reference: Path, start: str) -> tuple[dict, list[str]]:
    """One start's markdown section and payload, from the cached runs (``START_SECTIONS`` in order)."""
    path = reference / start / "start_eval.json"
    if not json_exists(path):
        return {"start": start, "complete": False}, [f"## Start `{start}`", "", "Not evaluated yet.", ""]
    s = FrontierStart.load(protocol, out, reference, start, read_json(path))
    lines = [
        f"## Start `{start}`",
        "",
        (
            f"Start: exact test Pass@1 {s.start_p.mean():.4f}. Pre-registered Pass@1 interval: "
            f"[{s.levels[0]:.3f}, {s.levels[-1]:.3f}], {len(s.levels)} levels."
        ),
        "",
    ]
    payload: dict[str, Any] = {"start": start, "start_pass1": float(s.start_p.mean()), "levels": list(s.levels)}
    for key, section in START_SECTIONS:
        section_lines, payload[key] = section(s)
        lines += section_lines
    payload["reached"] = {
        k: {m: bool(method_reaches([v for (am, _), v in by_arm.items() if am == m]).all()) for m in s.methods}
        for k, by_arm in s.values.items()
    }
    payload["complete"] = all(row.get("complete") for row in payload["verdicts"])
    payload["runs"] = [
        {
            "arm": f"{m} {lr:g}",
            "seed": r["seed"],
            "train_minutes": r["train_seconds"] / 60,
            "mean_load": r["load_average"]["mean"],
        }
        for (m, lr), runs in s.runs_by_arm.items()
        for r in runs
    ]
    return payload, lines


def frontier_figure(protocol: FrontierProtocol, out: Path, reference: Path) -> str | None:
    """Pass@``primary_k`` and Pass@``secondary_k`` against Pass@1, a line per arm (seed mean where every seed reaches
    the level), both starts; the pre-registered interval shaded."""
    evals = {s: reference / s / "start_eval.json" for s in protocol.exact.starts}
    starts = [
        s
        for s, p in evals.items()
        if json_exists(p) and any(arm_runs(protocol, out, s, *arm) for arm in arms(protocol, out, reference, s))
    ]
    if not starts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = buckets_of(protocol)
    ks = (protocol.primary_k, protocol.secondary_k)
    fig, axes = plt.subplots(len(ks), len(starts), figsize=(6 * len(starts), 4.5 * len(ks)), squeeze=False)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {m: cycle[i % len(cycle)] for i, m in enumerate(protocol.methods())}
    for col, start in enumerate(starts):
        start_eval = read_json(evals[start])
        start_p = probs_matrix([start_eval["test_p"]], buckets)
        named = arms(protocol, out, reference, start)
        rates = sorted({lr for _, lr in named})
        low, high = dict(protocol.pass1_intervals)[start]
        for row, k in enumerate(ks):
            ax = axes[row][col]
            ax.axvspan(low, high, color="0.9", label="pre-registered interval")
            ax.plot([start_p.mean()], [pass_at_k(start_p, k).mean()], "k*", ms=10, label="start")
            for method, lr in named:
                runs = arm_runs(protocol, out, start, method, lr)
                if not runs:
                    continue
                peak = min(max(trajectory(r, start_eval, buckets).mean(axis=1)) for r in runs)
                grid = np.linspace(start_p.mean(), peak, 60)
                v = arm_values(runs, start_eval, buckets, k, grid)
                style = ["-", "--", ":"][rates.index(lr) % 3]
                ax.plot(
                    grid,
                    np.nanmean(v, axis=(0, 2)),
                    style,
                    color=colors[method],
                    label=f"{METHOD_LABELS[method]} at {lr:g} ({len(runs)} seeds)",
                )
            ax.set(
                xlabel="exact test Pass@1 (mean over test problems)",
                ylabel=f"exact test Pass@{k}",
                title=f"{start} start: Pass@{k} at matched Pass@1",
            )
            ax.legend(fontsize=7)
    name = f"{NAME}.png"
    save_figure(fig, out / name, dpi=110)  # a palette PNG, a third of the bytes
    return name


def report(protocol: FrontierProtocol, out: Path, reference: Path) -> dict[str, Any]:
    """Write ``out/lm_frontier.md`` and ``out/lm_frontier.json`` from the cached runs; return the payload."""
    starts, body = start_sections(protocol.exact.starts, lambda start: start_section(protocol, out, reference, start))
    figure_name = frontier_figure(protocol, out, reference)
    if figure_name:
        body = [
            (
                f"![Exact test Pass@{protocol.primary_k} and Pass@{protocol.secondary_k} against Pass@1, a line per "
                f"arm]({figure_name})"
            ),
            "",
        ] + body
    planned = frontier_runs(protocol, out, reference)
    done = sum(json_exists(frontier_path(out, run)) for run in planned)
    complete = all(s.get("complete") for s in starts.values())
    header = [
        "# Tiny-LM study: the Pass@1-Pass@k frontier (`benchmarks/lm_study/frontier_protocol.py`)",
        "",
        f"**{done} of {len(planned)} runs named so far are finished**"
        + ("." if complete else "; every verdict below is interim.")
        + " Every number comes from finished runs only; rows say how many seeds they rest on.",
        "",
        f"Learning rates: {FRONTIER_RATE_RULE}",
        "",
        f"Frontier: {FRONTIER_DEFINITION}",
        "",
        f"Outcomes: {FRONTIER_OUTCOMES}",
        "",
        f"Verdict rule: {FRONTIER_VERDICT_RULE}",
        "",
        FRONTIER_DEFAULT_NOTE,
        "",
        f"Bootstrap: {protocol.bootstrap_resamples} resamples, seed {protocol.bootstrap_seed}. " + machine_note(),
        "",
    ]
    payload = {
        "protocol": repr(protocol),
        "runs_finished": done,
        "runs_named": len(planned),
        "complete": complete,
        "starts": starts,
        "figure": figure_name,
    }
    write_report(out, NAME, header + body, payload)
    return payload
