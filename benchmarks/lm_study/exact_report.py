"""Tables of the exact protocol from whatever runs are cached: exact Pass@k with bootstrap CIs, the gap against k,
the boundary effect against the start, entropy, and the verdict rows by ``EXACT_VERDICT_RULE``. Every row says how
many seeds it rests on; nothing is extrapolated to runs that have not finished. Run it with
``python -m benchmarks.lm_study.exact_protocol --report-only``.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import json_exists, read_json

from .config import EXACT_CLAIMS, EXACT_VERDICT_RULE, METHOD_LABELS, Claim, ExactProtocol
from .exact import pass_at_k, probs_matrix
from .exact_figures import figure
from .long_report import GUARD_PATIENCE, guard_alarm
from .plans import Run, run_path
from .stats import Interval, paired_problem_bootstrap, two_level_bootstrap, verdict

COMPARISONS = (("riskpo", "grpo"), ("riskpo", "gspo"), ("riskpo_authors", "grpo"), ("gspo", "grpo"))


def load_runs(protocol: ExactProtocol, out: Path, start: str) -> dict[str, list[dict[str, Any]]]:
    """Per method, its cached runs at the protocol's learning rate, sorted by seed."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for method in protocol.methods:
        found = [run_path(out, Run(start, method, protocol.lr(start, method), s)) for s in protocol.seeds]
        runs[method] = [read_json(p) for p in found if json_exists(p)]
    return runs


def buckets_of(protocol: ExactProtocol) -> list[str]:
    return [f"{d}digit" for d in protocol.lm.digits]


def fmt_interval(interval: Interval, digits: int = 3) -> str:
    return f"{interval.estimate:+.{digits}f} [{interval.low:+.{digits}f}, {interval.high:+.{digits}f}]"


def fmt_level(interval: Interval, digits: int = 3) -> str:
    return f"{interval.estimate:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def seeds_note(runs: dict[str, list[dict[str, Any]]], methods: list[str]) -> str:
    return ", ".join(f"{m}: {len(runs.get(m, []))}" for m in methods)


def claim_values(claim: Claim, who: str, runs, start_eval, buckets) -> np.ndarray | None:
    """The (seeds, problems) values of ``who`` (a method or ``"start"``) for ``claim``; None if no run finished."""
    if claim.metric == "entropy":
        entries = [start_eval["test_entropy"]] if who == "start" else [r["test_entropy"] for r in runs.get(who, [])]
        return np.array([[e["all"]] for e in entries]) if entries else None
    entries = [start_eval["test_p"]] if who == "start" else [r["test_p"] for r in runs.get(who, [])]
    if not entries:
        return None
    p = probs_matrix(entries, buckets, f"{claim.bucket}digit" if claim.bucket else None)
    if claim.metric == "widening":
        return pass_at_k(p, claim.k) - pass_at_k(p, 1)
    return pass_at_k(p, claim.k)


def claim_row(protocol: ExactProtocol, claim: Claim, start: str, runs, start_eval, buckets) -> dict[str, Any]:
    a = claim_values(claim, claim.a, runs, start_eval, buckets)
    b = claim_values(claim, claim.b, runs, start_eval, buckets)
    row: dict[str, Any] = {
        "claim": claim.label,
        "start": start,
        "seeds": {m: len(runs.get(m, [])) for m in (claim.a, claim.b) if m != "start"},
    }
    if a is None or b is None:
        row["verdict"] = "pending: no finished run"
        return row
    kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
    two_level = two_level_bootstrap(a, b, **kwargs)
    row["two_level"] = two_level.as_dict()
    if claim.metric != "entropy":
        row["problem_level"] = paired_problem_bootstrap(a, b, **kwargs).as_dict()
    by_rule = verdict(two_level, claim.sign)
    complete = all(n == len(protocol.seeds) for n in row["seeds"].values())
    row["verdict"] = (
        by_rule
        if complete
        else (f"interim ({min(row['seeds'].values())} of {len(protocol.seeds)} seeds): {by_rule} so far")
    )
    return row


def verdict_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of :func:`claim_row` rows."""
    lines = [
        "| claim | seeds (a / b) | difference [95% two-level CI] | problem-level CI | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        seeds = " / ".join(str(n) for n in row["seeds"].values()) or "-"
        if "two_level" not in row:
            lines.append(f"| {row['claim']} | {seeds} | - | - | {row['verdict']} |")
            continue
        t = row["two_level"]
        o = row.get("problem_level")
        lines.append(
            f"| {row['claim']} | {seeds} | {t['estimate']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}] | "
            + (f"[{o['low']:+.4f}, {o['high']:+.4f}]" if o else "(seed level only)")
            + f" | {row['verdict']} |"
        )
    return lines


def start_sections(starts: tuple[str, ...], section) -> tuple[dict[str, Any], list[str]]:
    """Every start's summary and markdown section, ``section(start)``, in the protocol's order of the starts."""
    summaries: dict[str, Any] = {}
    body: list[str] = []
    for start in starts:
        summaries[start], lines = section(start)
        body += lines
    return summaries, body


def machine_note() -> str:
    """The machine a report is written on; each run records its own load."""
    return f"Machine: {platform.machine()}, {os.cpu_count()} logical cores (shared)."


def write_report(out: Path, name: str, lines: list[str], payload: dict[str, Any]) -> None:
    """``out/<name>.md`` and ``out/<name>.json``, and the text on stdout."""
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    print("\n".join(lines), flush=True)


def start_report(protocol: ExactProtocol, out: Path, start: str) -> tuple[dict[str, Any], list[str]]:
    path = out / start / "start_eval.json"
    if not json_exists(path):
        return {"start": start, "runs": 0}, [f"## Start `{start}`", "", "Not evaluated yet.", ""]
    start_eval = read_json(path)
    runs = load_runs(protocol, out, start)
    buckets = buckets_of(protocol)
    methods = [m for m in protocol.methods if runs[m]]
    kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
    ks = [k for k in protocol.table_ks if k <= protocol.max_k]
    start_p = probs_matrix([start_eval["test_p"]], buckets)
    p_of = {m: probs_matrix([r["test_p"] for r in runs[m]], buckets) for m in methods}
    lines = [
        f"## Start `{start}`",
        "",
        f"Runs finished (seeds per method): {seeds_note(runs, list(protocol.methods))} of "
        f"{len(protocol.seeds)} each. Start weights SHA-256 `{start_eval['sha256'][:16]}...`.",
        "",
    ]
    payload: dict[str, Any] = {"start": start, "seeds": {m: [r["seed"] for r in runs[m]] for m in protocol.methods}}

    # Pass@k levels, with the two-level CI of the mean (a single seed: problem level only).
    lines += [
        "### Exact test Pass@k (final weights): mean over seeds, 95% two-level bootstrap CI",
        "",
        "| method (lr, seeds) | " + " | ".join(f"Pass@{k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    lines.append("| start | " + " | ".join(f"{pass_at_k(start_p, k).mean():.3f}" for k in ks) + " |")
    payload["pass_at_k"] = {"start": {k: float(pass_at_k(start_p, k).mean()) for k in ks}}
    for m in methods:
        cells = [two_level_bootstrap(pass_at_k(p_of[m], k), **kwargs) for k in ks]
        payload["pass_at_k"][m] = {k: c.as_dict() for k, c in zip(ks, cells)}
        lines.append(
            f"| {METHOD_LABELS[m]} ({protocol.lr(start, m):g}, {len(runs[m])}) | "
            + " | ".join(fmt_level(c) for c in cells)
            + " |"
        )
    lines.append("")

    # The gap against k, paired by problem.
    lines += [
        "### The gap against k: difference of exact test Pass@k, paired by problem",
        "",
        "Each cell: estimate [95% two-level CI (seeds, then problems)]; below it the problem-level CI of the "
        "seed means.",
        "",
        "| comparison (seeds) | " + " | ".join(f"k = {k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    payload["gaps"] = {}
    for a, b in COMPARISONS:
        if a not in p_of or b not in p_of:
            continue
        two = [two_level_bootstrap(pass_at_k(p_of[a], k), pass_at_k(p_of[b], k), **kwargs) for k in ks]
        one = [paired_problem_bootstrap(pass_at_k(p_of[a], k), pass_at_k(p_of[b], k), **kwargs) for k in ks]
        payload["gaps"][f"{a}-{b}"] = {
            k: {"two_level": t.as_dict(), "problem_level": o.as_dict()} for k, t, o in zip(ks, two, one)
        }
        lines.append(
            f"| {a} - {b} ({len(runs[a])} / {len(runs[b])}) | " + " | ".join(fmt_interval(t) for t in two) + " |"
        )
        lines.append("| (problem level) | " + " | ".join(f"[{o.low:+.3f}, {o.high:+.3f}]" for o in one) + " |")
    lines.append("")

    # The boundary effect: each method against the start.
    lines += [
        "### Against the start (the boundary effect): method minus start, exact test Pass@k",
        "",
        "| method (seeds) | " + " | ".join(f"k = {k}" for k in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    payload["vs_start"] = {}
    for m in methods:
        cells = [two_level_bootstrap(pass_at_k(p_of[m], k), pass_at_k(start_p, k), **kwargs) for k in ks]
        payload["vs_start"][m] = {k: c.as_dict() for k, c in zip(ks, cells)}
        lines.append(f"| {m} ({len(runs[m])}) | " + " | ".join(fmt_interval(c) for c in cells) + " |")
    lines.append("")

    # Per bucket, and entropy.
    lines += [
        "### Per bucket (exact test Pass@1 / Pass@64 / Pass@1024, mean over seeds) and sampled test entropy",
        "",
        "| method | "
        + " | ".join(buckets)
        + " | entropy / start (all) | "
        + " | ".join(f"{b} entropy / start" for b in buckets)
        + " |",
        "|---|" + "---|" * (2 * len(buckets) + 1),
    ]

    def bucket_cells(entries) -> list[str]:
        return [
            " / ".join(f"{pass_at_k(probs_matrix(entries, buckets, b), k).mean():.3f}" for k in (1, 64, 1024))
            for b in buckets
        ]

    lines.append(
        "| start | "
        + " | ".join(bucket_cells([start_eval["test_p"]]))
        + " | 1 | "
        + " | ".join("1" for _ in buckets)
        + " |"
    )
    payload["entropy_ratio"] = {}
    for m in methods:
        ratios = {
            b: [r["test_entropy"][b] / start_eval["test_entropy"][b] for r in runs[m]] for b in ["all", *buckets]
        }
        payload["entropy_ratio"][m] = ratios
        lines.append(
            f"| {m} | "
            + " | ".join(bucket_cells([r["test_p"] for r in runs[m]]))
            + " | "
            + " | ".join(
                f"{np.mean(ratios[b]):.2f} ({np.min(ratios[b]):.2f}-{np.max(ratios[b]):.2f})"
                for b in ["all", *buckets]
            )
            + " |"
        )
    lines += [
        "",
        "Entropy: the sampling policy's token entropy on the test split from "
        f"{protocol.entropy_samples} sampled completions per problem (each run its own seed), over the "
        "start's; mean (min-max) over seeds.",
        "",
    ]

    # The best validation checkpoint (secondary).
    best = {m: [r.get("best_val_test_p", r["test_p"]) for r in runs[m]] for m in methods}
    if methods:
        lines += [
            "### Best validation checkpoint (secondary): exact test Pass@1 / Pass@64, mean over seeds",
            "",
            "| method | Pass@1 | Pass@64 | best validation batch per seed |",
            "|---|---|---|---|",
        ]
        for m in methods:
            p = probs_matrix(best[m], buckets)
            lines.append(
                f"| {m} | {pass_at_k(p, 1).mean():.3f} | {pass_at_k(p, 64).mean():.3f} | "
                + ", ".join(str(r["best_val_generation_batch"]) for r in runs[m])
                + " |"
            )
        lines.append("")

    # Verdict rows.
    rows = [claim_row(protocol, c, start, runs, start_eval, buckets) for c in EXACT_CLAIMS]
    payload["claims"] = rows
    lines += [
        "### Verdict rows (final weights, by the rule)",
        "",
        f"Rule: {EXACT_VERDICT_RULE}",
        "",
        *verdict_table(rows),
        "",
    ]

    # The regime guard's post hoc signal, described (no collapse definition is part of this protocol).

    lines += [
        "### Coverage collapse and the all-wrong share (the regime guard's post hoc signal), descriptive",
        "",
        "Not part of this protocol's claims. Per run: the lowest tracked exact validation Pass@64 over the "
        "start's, and the first tracked generation batch where it is below half (the long protocol's "
        "definition of a coverage collapse, applied here after the fact); the mean share of training prompts "
        f"whose {protocol.lm.num_generations} completions all failed, and the first generation batch at which "
        f"it stayed >= 0.5 for {GUARD_PATIENCE} batches in a row.",
        "",
        "| method | seed | lowest val Pass@64 / start | below half at | mean all-wrong share | rule >= 0.5 fires at |",
        "|---|---|---|---|---|---|",
    ]
    start_val64 = float(pass_at_k(probs_matrix([start_eval["val_p"]], buckets), 64).mean())
    payload["collapse_and_all_wrong"] = {}
    for m in protocol.methods:
        for r in runs[m]:
            ratios = [
                (e["generation_batch"], float(pass_at_k(probs_matrix([e["val_p"]], buckets), 64).mean()) / start_val64)
                for e in r["tracked"]
            ]
            lowest = min((x for _, x in ratios), default=None)
            below = next((batch for batch, x in ratios if x < 0.5), None)
            series = [b.get("frac_prompts_all_wrong") for b in r["batch_signals"]]
            known = [v for v in series if v is not None]
            fired = guard_alarm(series, ">=", 0.5, GUARD_PATIENCE)
            payload["collapse_and_all_wrong"][f"{m}-seed{r['seed']}"] = {
                "lowest_val_pass64_ratio": lowest,
                "below_half_at": below,
                "mean_all_wrong": float(np.mean(known)) if known else None,
                "fires_at": fired,
            }
            lines.append(
                f"| {m} | {r['seed']} | "
                + (f"{lowest:.2f}" if lowest is not None else "n/a")
                + f" | {below if below else 'never'} | "
                + (f"{np.mean(known):.2f}" if known else "n/a")
                + f" | {fired if fired else 'never'} |"
            )
    lines.append("")

    # Wall time and load.
    lines += ["### Runs", "", "| run | train min | mean load |", "|---|---|---|"]
    for m in protocol.methods:
        for r in runs[m]:
            lines.append(f"| {m} seed {r['seed']} | {r['train_seconds'] / 60:.1f} | {r['load_average']['mean']:.1f} |")
    lines.append("")
    payload["runs"] = sum(len(v) for v in runs.values())
    return payload, lines


def report(protocol: ExactProtocol, out: Path, skip_figure: bool = False) -> dict[str, Any]:
    """Write ``out/lm_exact.md``, ``out/lm_exact.json`` and the figure from the cached runs; return the payload."""
    total = len(protocol.starts) * len(protocol.methods) * len(protocol.seeds)
    starts, body = start_sections(protocol.starts, lambda start: start_report(protocol, out, start))
    done = sum(s.get("runs", 0) for s in starts.values())
    figure_name = None
    if not skip_figure:
        evals = {
            s: read_json(out / s / "start_eval.json")
            for s in protocol.starts
            if json_exists(out / s / "start_eval.json")
        }
        figure_name = figure(
            protocol, out, {s: load_runs(protocol, out, s) for s in evals}, evals, buckets_of(protocol)
        )
        if figure_name:
            body = [f"![Exact test Pass@k against k, and the gap to GRPO with its band]({figure_name})", ""] + body
    header = [
        "# Tiny-LM study, exact evaluation (`benchmarks/lm_study/exact_protocol.py`)",
        "",
        f"**{done} of {total} runs finished.** Every number is computed from the finished runs only; rows say how "
        "many seeds they rest on. Exact: each test problem's success probability p under the sampling policy "
        "(temperature 0.8, whole vocabulary) by teacher forcing; Pass@k = 1 - (1 - p)^k, no sampling noise. "
        f"Bootstrap: {protocol.bootstrap_resamples} resamples, seed {protocol.bootstrap_seed}, percentile intervals.",
        "",
        machine_note(),
        "",
    ]
    payload = {
        "protocol": repr(protocol),
        "runs_finished": done,
        "runs_total": total,
        "starts": starts,
        "figure": figure_name,
    }
    write_report(out, "lm_exact", header + body, payload)
    return payload
