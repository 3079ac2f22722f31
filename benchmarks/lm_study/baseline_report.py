"""The baseline study's report from whatever runs are cached: the learning-rate grid and its choice, exact Pass@k
levels with bootstrap CIs, the verdict rows of ``BASELINE_CLAIMS``, every ``loo`` run's coverage, and the default by
``BASELINE_DEFAULT_RULE``. Rows say how many seeds they rest on; no verdict and no default is given before the runs
they need have finished. Run it with ``python -m benchmarks.lm_study.baseline_protocol --report-only``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import json_exists, read_json

from .config import BASELINE_CLAIMS, BASELINE_DEFAULT_RULE, EXACT_VERDICT_RULE, METHOD_LABELS, BaselineProtocol
from .exact import pass_at_k, probs_matrix
from .exact_figures import figure
from .exact_report import buckets_of, claim_row, fmt_level, machine_note, start_sections, verdict_table, write_report
from .plans import Run, baseline_chosen_lr, baseline_grid_scores, baseline_path, baseline_runs
from .stats import two_level_bootstrap

LABELS = {**METHOD_LABELS, "grpo_equal_lr": "GRPO at loo's lr"}
# The default rule's conditions: (claim label, what must hold).
RULE_CONDITIONS = (
    ("loo raises Pass@64 over the paper's advantage", "supported"),
    ("loo raises Pass@1024 over the paper's advantage", "supported"),
    ("loo raises Pass@1 over the paper's advantage", "not contradicted"),
)


def load(path: Path) -> dict[str, Any] | None:
    return read_json(path) if json_exists(path) else None


def study_runs(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> tuple[dict[str, list], dict]:
    """Per compared method, its finished runs from ``start`` (``riskpo_loo`` at its chosen rate, the references at
    the exact protocol's, ``grpo_equal_lr`` at loo's rate), and the rates they ran at."""
    exact = protocol.exact
    lr = baseline_chosen_lr(protocol, out, reference, start)
    rates: dict[str, float | None] = {protocol.method: lr, "grpo_equal_lr": lr}
    runs: dict[str, list] = {}
    for method in protocol.references:
        rates[method] = exact.lr(start, method)
    for name, method in [
        (protocol.method, protocol.method),
        *((m, m) for m in protocol.references),
        ("grpo_equal_lr", protocol.control_method),
    ]:
        if rates[name] is None:
            runs[name] = []
            continue
        found = [
            load(baseline_path(protocol, out, reference, Run(start, method, rates[name], s))) for s in exact.seeds
        ]
        runs[name] = [r for r in found if r is not None]
    if start != protocol.control_start and rates["grpo_equal_lr"] != exact.lr(start, protocol.control_method):
        runs["grpo_equal_lr"] = []  # not part of the protocol from this start unless the cached GRPO runs match
    return runs, rates


def loo_runs(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> list[dict[str, Any]]:
    """Every finished ``loo`` run from ``start``, grid included (the collapse condition counts them all)."""
    paths = {
        baseline_path(protocol, out, reference, run)
        for run in baseline_runs(protocol, out, reference)
        if run.start == start and run.method == protocol.method
    }
    return [r for r in (load(p) for p in sorted(paths)) if r is not None]


def coverage_rows(protocol: BaselineProtocol, runs: list[dict], start_eval: dict, buckets: list[str]) -> list[dict]:
    """Per ``loo`` run: its lowest tracked exact validation Pass@64 over the start's, and the first tracked
    generation batch below ``coverage_collapse_fraction`` of it (None: never, no collapse)."""
    start64 = float(pass_at_k(probs_matrix([start_eval["val_p"]], buckets), 64).mean())
    rows = []
    for r in runs:
        ratios = [
            (
                e["generation_batch"],
                float(pass_at_k(probs_matrix([e["val_p"]], buckets), 64).mean()) / max(start64, 1e-300),
            )
            for e in r["tracked"]
        ]
        rows.append(
            {
                "lr": r["lr"],
                "seed": r["seed"],
                "lowest": min(x for _, x in ratios),
                "collapsed_at": next((b for b, x in ratios if x < protocol.coverage_collapse_fraction), None),
            }
        )
    return rows


def start_section(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> tuple[dict, list[str]]:
    exact = protocol.exact
    start_eval = load(reference / start / "start_eval.json")
    if start_eval is None:
        return {"start": start, "complete": False}, [f"## Start `{start}`", "", "Not evaluated yet.", ""]
    buckets = buckets_of(exact)
    runs, rates = study_runs(protocol, out, reference, start)
    lines = [f"## Start `{start}`", ""]
    payload: dict[str, Any] = {"start": start, "rates": rates}

    # The grid and the choice (validation only).
    scores = baseline_grid_scores(protocol, out, reference, start)
    lr = rates[protocol.method]
    payload["grid"] = {f"{k:g}": v for k, v in scores.items()}
    lines += [
        f"### Learning rate for `loo` (seed {protocol.grid_seed}): final exact validation criterion",
        "",
        "| lr | mean of validation Pass@1 and Pass@16 |",
        "|---|---|",
    ]
    for rate, score in scores.items():
        mark = " (chosen)" if rate == lr else ""
        lines.append(f"| {rate:g}{mark} | " + ("not finished" if score is None else f"{score:.4f}") + " |")
    lines += ["", "Chosen: " + (f"{lr:g}." if lr is not None else "pending (the grid is not complete)."), ""]

    # Pass@k levels.
    kwargs = {"resamples": exact.bootstrap_resamples, "seed": exact.bootstrap_seed}
    ks = list(exact.table_ks)
    lines += [
        "### Exact test Pass@k (final weights): mean over seeds, 95% two-level bootstrap CI",
        "",
        "| method (lr, seeds) | " + " | ".join(f"Pass@{k}" for k in ks) + " | test entropy / start |",
        "|---|" + "---|" * (len(ks) + 1),
    ]
    start_p = probs_matrix([start_eval["test_p"]], buckets)
    lines.append("| start | " + " | ".join(f"{pass_at_k(start_p, k).mean():.3f}" for k in ks) + " | 1 |")
    payload["pass_at_k"] = {}
    for name, method_runs in runs.items():
        if not method_runs:
            continue
        p = probs_matrix([r["test_p"] for r in method_runs], buckets)
        cells = [two_level_bootstrap(pass_at_k(p, k), **kwargs) for k in ks]
        ratio = np.mean([r["test_entropy"]["all"] / start_eval["test_entropy"]["all"] for r in method_runs])
        payload["pass_at_k"][name] = {k: c.as_dict() for k, c in zip(ks, cells)}
        lines.append(
            f"| {LABELS[name]} ({rates[name]:g}, {len(method_runs)}) | "
            + " | ".join(fmt_level(c) for c in cells)
            + f" | {ratio:.2f} |"
        )
    lines.append("")

    # Verdict rows.
    rows = []
    for claim in BASELINE_CLAIMS:
        if claim.b == "grpo_equal_lr" and start != protocol.control_start and not runs["grpo_equal_lr"]:
            rows.append(
                {
                    "claim": claim.label,
                    "start": start,
                    "seeds": {},
                    "verdict": f"not in the protocol from this start (GRPO's runs here use lr "
                    f"{exact.lr(start, protocol.control_method):g})",
                }
            )
            continue
        rows.append(claim_row(exact, claim, start, runs, start_eval, buckets))
    payload["claims"] = rows
    lines += ["### Verdict rows (final weights, by the rule)", "", *verdict_table(rows), ""]

    # Coverage of every loo run.
    every_loo = loo_runs(protocol, out, reference, start)
    coverage = coverage_rows(protocol, every_loo, start_eval, buckets)
    payload["coverage"] = coverage
    lines += [
        "### Coverage of every `loo` run (a collapse: tracked validation Pass@64 below "
        f"{protocol.coverage_collapse_fraction:g} of the start's)",
        "",
        "| lr | seed | lowest validation Pass@64 / start | below the line at generation batch |",
        "|---|---|---|---|",
    ]
    for row in coverage:
        lines.append(
            f"| {row['lr']:g} | {row['seed']} | {row['lowest']:.2f} | "
            f"{row['collapsed_at'] if row['collapsed_at'] is not None else 'never'} |"
        )
    lines.append("")

    # Runs and load.
    lines += ["### Runs", "", "| run | train min | mean load |", "|---|---|---|"]
    for r in every_loo + [r for r in runs["grpo_equal_lr"] if r["lr"] != exact.lr(start, "grpo")]:
        lines.append(
            f"| {r['method']} lr {r['lr']:g} seed {r['seed']} | {r['train_seconds'] / 60:.1f} | "
            f"{r['load_average']['mean']:.1f} |"
        )
    lines.append("")

    expected_loo = len(protocol.learning_rates) + len(exact.seeds) - (protocol.grid_seed in exact.seeds)
    payload["complete"] = (
        lr is not None
        and len(every_loo) == expected_loo
        and all(len(runs[m]) == len(exact.seeds) for m in (protocol.method, *protocol.references))
        and (start != protocol.control_start or len(runs["grpo_equal_lr"]) == len(exact.seeds))
    )
    return payload, lines


def default_decision(protocol: BaselineProtocol, starts: dict[str, dict]) -> dict[str, Any]:
    """:data:`BASELINE_DEFAULT_RULE` on complete data: the default and every failed condition; 'pending' before."""
    if not all(s.get("complete") for s in starts.values()):
        return {"default": "pending", "failed": [], "note": "not every run the rule needs has finished"}
    failed = []
    for start, section in starts.items():
        verdicts = {row["claim"]: row["verdict"] for row in section["claims"]}
        for label, needed in RULE_CONDITIONS:
            verdict = verdicts[label]
            holds = verdict == "supported" if needed == "supported" else verdict != "contradicted"
            if not holds:
                failed.append(f"{start} start: '{label}' must be {needed}; it is {verdict}")
        collapsed = [row for row in section["coverage"] if row["collapsed_at"] is not None]
        if collapsed:
            failed.append(
                f"{start} start: {len(collapsed)} loo run(s) collapsed ("
                + ", ".join(f"lr {r['lr']:g} seed {r['seed']}" for r in collapsed)
                + ")"
            )
    return {"default": "none" if failed else "loo", "failed": failed}


def baseline_figure(protocol: BaselineProtocol, out: Path, reference: Path) -> str | None:
    """The exact protocol's figure for ``loo`` (at its chosen rate, once chosen) and the references."""
    methods = (protocol.method, *protocol.references)
    evals = {s: load(reference / s / "start_eval.json") for s in protocol.exact.starts}
    evals = {s: e for s, e in evals.items() if e is not None}
    runs = {s: {m: study_runs(protocol, out, reference, s)[0][m] for m in methods} for s in evals}
    return figure(
        replace(protocol.exact, methods=methods),
        out,
        runs,
        evals,
        buckets_of(protocol.exact),
        against_grpo=(protocol.method, "riskpo", "riskpo_authors"),
        name="lm_baseline_pass_at_k.png",
    )


def report(protocol: BaselineProtocol, out: Path, reference: Path) -> dict[str, Any]:
    """Write ``out/lm_baseline.md`` and ``out/lm_baseline.json`` from the cached runs; return the payload."""
    starts, body = start_sections(protocol.exact.starts, lambda start: start_section(protocol, out, reference, start))
    figure_name = baseline_figure(protocol, out, reference)
    if figure_name:
        body = [
            f"![Exact test Pass@k against k, and the gap to GRPO (at its own lr) with its band]({figure_name})",
            "",
        ] + body
    planned = baseline_runs(protocol, out, reference)
    done = sum(json_exists(baseline_path(protocol, out, reference, run)) for run in planned)
    decision = default_decision(protocol, starts)
    if decision["default"] == "pending":
        verdict_line = f"**Default: pending** ({decision['note']}); it stays `advantage_baseline='none'` until then."
    elif decision["failed"]:
        verdict_line = (
            "**Default: stays `advantage_baseline='none'`.** Failed conditions: " + "; ".join(decision["failed"]) + "."
        )
    else:
        verdict_line = "**Default: `advantage_baseline='loo'`**: every condition of the rule holds from both starts."
    header = [
        "# Tiny-LM study: the leave-one-out baseline (`benchmarks/lm_study/baseline_protocol.py`)",
        "",
        f"**{done} of {len(planned)} runs named so far are finished** (the learning-rate grid decides the rest; the "
        "references are the exact protocol's cached runs). Every number comes from finished runs only; rows say how "
        "many seeds they rest on.",
        "",
        f"Verdict rule: {EXACT_VERDICT_RULE}",
        "",
        f"Default rule: {BASELINE_DEFAULT_RULE}",
        "",
        verdict_line,
        "",
        f"Bootstrap: {protocol.exact.bootstrap_resamples} resamples, seed {protocol.exact.bootstrap_seed}. "
        + machine_note(),
        "",
    ]
    payload = {
        "protocol": repr(protocol),
        "runs_finished": done,
        "runs_named": len(planned),
        "starts": starts,
        "default": decision,
        "figure": figure_name,
    }
    write_report(out, "lm_baseline", header + body, payload)
    return payload
