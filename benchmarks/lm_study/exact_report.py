"""Tables of the exact protocol from whatever runs are cached: exact Pass@k with bootstrap CIs, the gap against k,
the boundary effect against the start, entropy, and the verdict rows by ``EXACT_VERDICT_RULE``. Every row says how
many seeds it rests on; nothing is extrapolated to runs that have not finished. Run it with
``python -m benchmarks.lm_study.exact_protocol --report-only``.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StartRuns:
    """What every section of one start's report reads: its evaluation, its cached runs and the exact Pass@k inputs."""

    protocol: ExactProtocol
    start: str
    start_eval: dict[str, Any]
    runs: dict[str, list[dict[str, Any]]]
    buckets: list[str]
    methods: list[str]  # those with a finished run
    ks: list[int]
    start_p: np.ndarray
    p_of: dict[str, np.ndarray]

    @classmethod
    def load(cls, protocol: ExactProtocol, out: Path, start: str, start_eval: dict[str, Any]) -> StartRuns:
        runs = load_runs(protocol, out, start)
        buckets = buckets_of(protocol)
        methods = [m for m in protocol.methods if runs[m]]
        return cls(
            protocol,
            start,
            start_eval,
            runs,
            buckets,
            methods,
            ks=[k for k in protocol.table_ks if k <= protocol.max_k],
            start_p=probs_matrix([start_eval["test_p"]], buckets),
            p_of={m: probs_matrix([r["test_p"] for r in runs[m]], buckets) for m in methods},
        )

    @property
    def bootstrap(self) -> dict[str, int]:
        return {"resamples": self.protocol.bootstrap_resamples, "seed": self.protocol.bootstrap_seed}

    def k_header(self, first: str, label: str) -> list[str]:
        return [
            f"| {first} | " + " | ".join(label.format(k=k) for k in self.ks) + " |",
            "|---|" + "---|" * len(self.ks),
        ]


def pass_at_k_section(s: StartRuns) -> tuple[list[str], dict[str, Any]]:
    """Pass@k levels, with the two-level CI of the mean (a single seed: problem level only)."""
    lines = [
        "### Exact test Pass@k (final weights): mean over seeds, 95% two-level bootstrap CI",
        "",
        *s.k_header("method (lr, seeds)", "Pass@{k}"),
    ]
    lines.append("| start | " + " | ".join(f"{pass_at_k(s.start_p, k).mean():.3f}" for k in s.ks) + " |")
    levels: dict[str, Any] = {"start": {k: float(pass_at_k(s.start_p, k).mean()) for k in s.ks}}
    for m in s.methods:
        cells = [two_level_bootstrap(pass_at_k(s.p_of[m], k), **s.bootstrap) for k in s.ks]
        levels[m] = {k: c.as_dict() for k, c in zip(s.ks, cells)}
        lines.append(
            f"| {METHOD_LABELS[m]} ({s.protocol.lr(s.start, m):g}, {len(s.runs[m])}) | "
            + " | ".join(fmt_level(c) for c in cells)
            + " |"
        )
    lines.append("")
    return lines, levels


def gap_section(s: StartRuns) -> tuple[list[str], dict[str, Any]]:
    """The gap against k, paired by problem."""
    lines = [
        "### The gap against k: difference of exact test Pass@k, paired by problem",
        "",
        "Each cell: estimate [95% two-level CI (seeds, then problems)]; below it the problem-level CI of the "
        "seed means.",
        "",
        *s.k_header("comparison (seeds)", "k = {k}"),
    ]
    gaps: dict[str, Any] = {}
    for a, b in COMPARISONS:
        if a not in s.p_of or b not in s.p_of:
            continue
        pairs = [(pass_at_k(s.p_of[a], k), pass_at_k(s.p_of[b], k)) for k in s.ks]
        two = [two_level_bootstrap(x, y, **s.bootstrap) for x, y in pairs]
        one = [paired_problem_bootstrap(x, y, **s.bootstrap) for x, y in pairs]
        gaps[f"{a}-{b}"] = {
            k: {"two_level": t.as_dict(), "problem_level": o.as_dict()} for k, t, o in zip(s.ks, two, one)
        }
        lines.append(
            f"| {a} - {b} ({len(s.runs[a])} / {len(s.runs[b])}) | " + " | ".join(fmt_interval(t) for t in two) + " |"
        )
        lines.append("| (problem level) | " + " | ".join(f"[{o.low:+.3f}, {o.high:+.3f}]" for o in one) + " |")
    lines.append("")
    return lines, gaps


def vs_start_section(s: StartRuns) -> tuple[list[str], dict[str, Any]]:
    """The boundary effect: each method against the start."""
    lines = [
        "### Against the start (the boundary effect): method minus start, exact test Pass@k",
        "",
        *s.k_header("method (seeds)", "k = {k}"),
    ]
    differences: dict[str, Any] = {}
    for m in s.methods:
        cells = [two_level_bootstrap(pass_at_k(s.p_of[m], k), pass_at_k(s.start_p, k), **s.bootstrap) for k in s.ks]
        differences[m] = {k: c.as_dict() for k, c in zip(s.ks, cells)}
        lines.append(f"| {m} ({len(s.runs[m])}) | " + " | ".join(fmt_interval(c) for c in cells) + " |")
    lines.append("")
    return lines, differences


def bucket_and_entropy_section(s: StartRuns) -> tuple[list[str], dict[str, Any]]:
    """Per bucket, and the sampled entropy over the start's."""
    buckets = s.buckets
    lines = [
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
        + " | ".join(bucket_cells([s.start_eval["test_p"]]))
        + " | 1 | "
        + " | ".join("1" for _ in buckets)
        + " |"
    )
    entropy_ratio: dict[str, Any] = {}
    for m in s.methods:
        ratios = {
            b: [r["test_entropy"][b] / s.start_eval["test_entropy"][b] for r in s.runs[m]] for b in ["all", *buckets]
        }
        entropy_ratio[m] = ratios
        lines.append(
            f"| {m} | "
            + " | ".join(bucket_cells([r["test_p"] for r in s.runs[m]]))
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
        f"{s.protocol.entropy_samples} sampled completions per problem (each run its own seed), over the "
        "start's; mean (min-max) over seeds.",
        "",
    ]
    return lines, entropy_ratio


def best_checkpoint_section(s: StartRuns) -> tuple[list[str], None]:
    """The best validation checkpoint (secondary)."""
    if not s.methods:
        return [], None
    lines = [
        "### Best validation checkpoint (secondary): exact test Pass@1 / Pass@64, mean over seeds",
        "",
        "| method | Pass@1 | Pass@64 | best validation batch per seed |",
        "|---|---|---|---|",
    ]
    for m in s.methods:
        p = probs_matrix([r.get("best_val_test_p", r["test_p"]) for r in s.runs[m]], s.buckets)
        lines.append(
            f"| {m} | {pass_at_k(p, 1).mean():.3f} | {pass_at_k(p, 64).mean():.3f} | "
            + ", ".join(str(r["best_val_generation_batch"]) for r in s.runs[m])
            + " |"
        )
    lines.append("")
    return lines, None


def verdict_section(s: StartRuns) -> tuple[list[str], list[dict[str, Any]]]:
    """The verdict rows of the protocol's claims, by its rule."""
    rows = [claim_row(s.protocol, c, s.start, s.runs, s.start_eval, s.buckets) for c in EXACT_CLAIMS]
    lines = [
        "### Verdict rows (final weights, by the rule)",
        "",
        f"Rule: {EXACT_VERDICT_RULE}",
        "",
        *verdict_table(rows),
        "",
    ]
    return lines, rows


def collapse_section(s: StartRuns) -> tuple[list[str], dict[str, Any]]:
    """The regime guard's post hoc signal, described (no collapse definition is part of this protocol)."""
    lines = [
        "### Coverage collapse and the all-wrong share (the regime guard's post hoc signal), descriptive",
        "",
        "Not part of this protocol's claims. Per run: the lowest tracked exact validation Pass@64 over the "
        "start's, and the first tracked generation batch where it is below half (the long protocol's "
        "definition of a coverage collapse, applied here after the fact); the mean share of training prompts "
        f"whose {s.protocol.lm.num_generations} completions all failed, and the first generation batch at which "
        f"it stayed >= 0.5 for {GUARD_PATIENCE} batches in a row.",
        "",
        "| method | seed | lowest val Pass@64 / start | below half at | mean all-wrong share | rule >= 0.5 fires at |",
        "|---|---|---|---|---|---|",
    ]
    start_val64 = float(pass_at_k(probs_matrix([s.start_eval["val_p"]], s.buckets), 64).mean())
    signals: dict[str, Any] = {}
    for m in s.protocol.methods:
        for r in s.runs[m]:
            ratios = [
                (
                    e["generation_batch"],
                    float(pass_at_k(probs_matrix([e["val_p"]], s.buckets), 64).mean()) / start_val64,
                )
                for e in r["tracked"]
            ]
            lowest = min((x for _, x in ratios), default=None)
            below = next((batch for batch, x in ratios if x < 0.5), None)
            series = [b.get("frac_prompts_all_wrong") for b in r["batch_signals"]]
            known = [v for v in series if v is not None]
            fired = guard_alarm(series, ">=", 0.5, GUARD_PATIENCE)
            signals[f"{m}-seed{r['seed']}"] = {
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
    return lines, signals


def runs_section(s: StartRuns) -> tuple[list[str], None]:
    """Wall time and load of each run."""
    lines = ["### Runs", "", "| run | train min | mean load |", "|---|---|---|"]
    for m in s.protocol.methods:
        for r in s.runs[m]:
            lines.append(f"| {m} seed {r['seed']} | {r['train_seconds'] / 60:.1f} | {r['load_average']['mean']:.1f} |")
    lines.append("")
    return lines, None


# A start's sections in report order, each with its payload key (None: a table the payload does not repeat).
START_SECTIONS = (
    ("pass_at_k", pass_at_k_section),
    ("gaps", gap_section),
    ("vs_start", vs_start_section),
    ("entropy_ratio", bucket_and_entropy_section),
    (None, best_checkpoint_section),
    ("claims", verdict_section),
    ("collapse_and_all_wrong", collapse_section),
    (None, runs_section),
)


def start_report(protocol: ExactProtocol, out: Path, start: str) -> tuple[dict[str, Any], list[str]]:
    """One start's markdown section and payload, from its cached runs (``START_SECTIONS`` in order)."""
    path = out / start / "start_eval.json"
    if not json_exists(path):
        return {"start": start, "runs": 0}, [f"## Start `{start}`", "", "Not evaluated yet.", ""]
    s = StartRuns.load(protocol, out, start, read_json(path))
    lines = [
        f"## Start `{start}`",
        "",
        f"Runs finished (seeds per method): {seeds_note(s.runs, list(protocol.methods))} of "
        f"{len(protocol.seeds)} each. Start weights SHA-256 `{s.start_eval['sha256'][:16]}...`.",
        "",
    ]
    payload: dict[str, Any] = {"start": start, "seeds": {m: [r["seed"] for r in s.runs[m]] for m in protocol.methods}}
    for key, section in START_SECTIONS:
        section_lines, value = section(s)
        lines += section_lines
        if key is not None:
            payload[key] = value
    payload["runs"] = sum(len(v) for v in s.runs.values())
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
