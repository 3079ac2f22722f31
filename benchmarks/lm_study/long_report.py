"""Tables and verdict numbers of the long-horizon protocol, from whatever runs have finished (figures:
:mod:`.long_figures`).

Every number the verdicts in ``docs/replication.md`` cite is computed here from the cached runs; the definitions of a
collapse are :class:`~benchmarks.lm_study.config.LongProtocol`'s, and the guard's candidate thresholds are fixed in
:data:`GUARD_CANDIDATES` below.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._common import json_exists, json_files, mean_std, read_json, write_results

from .config import LONG_SELECTION_CRITERION, METHOD_LABELS, LongProtocol
from .run import run_name, select_lrs, selection_k

BUCKETS = ("2digit", "3digit", "4digit")
SHOWN_KS = (1, 2, 4, 8, 16, 32, 64)
# Per-batch signals a regime guard could watch, and the thresholds tried for each: the guard fires when the signal
# stays past the threshold for GUARD_PATIENCE training batches in a row.
GUARD_CANDIDATES: dict[str, tuple[str, tuple[float, ...]]] = {
    "frac_negative_advantage": (">=", (0.5, 0.7, 0.9)),
    "reward_advantage_corr": ("<=", (0.0, 0.2, 0.4)),
    "quantile_gap": ("<=", (0.0, 0.5)),
}
GUARD_PATIENCE = 10
# Added after the low start's runs and the moderate start's RiskPO grid had finished (post hoc, marked * in the
# report): every run of the paper's advantage pushed ~80% of completions down in both regimes, so the first candidate
# could not tell them apart; the share of all-wrong prompts (recorded from the first run) can.
POST_HOC_GUARD_CANDIDATES: dict[str, tuple[str, tuple[float, ...]]] = {
    "frac_prompts_all_wrong": (">=", (0.3, 0.5, 0.7)),
}
# The pairs the verdicts compare: (challenger, reference).
COMPARISONS = (("riskpo", "grpo"), ("riskpo", "gspo"), ("riskpo_authors", "grpo"), ("riskpo_authors", "gspo"))


def run_time(run: dict[str, Any]) -> str:
    """Wall minutes of training with evaluation, and the mean 1-minute load while it ran (not recorded by the
    first runs)."""
    load = run.get("load_average")
    minutes = f"{run['train_seconds'] / 60:.0f}"
    return f"{minutes} ({load['mean']:.1f})" if load else f"{minutes} (n/r)"


def load_long_runs(out: Path, start: str) -> dict[str, dict[str, Any]]:
    return {p.stem: read_json(p) for p in json_files(out / start / "runs")}


def _fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "n/a"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def chosen_runs(
    protocol: LongProtocol, out: Path, start: str, methods: list[str], runs: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Per method with a complete grid, the finished runs at its chosen learning rate (one per seed)."""
    seeds = protocol.lm.test_seeds if start == "low" else protocol.seeds_moderate
    chosen = select_lrs(protocol.lm, out / start, methods)
    return {m: [runs[n] for s in seeds if (n := run_name(m, lr, s)) in runs] for m, lr in chosen.items()}


# --- collapse and the guard's signals --------------------------------------------------------------------------------


def collapse_batch(run: dict[str, Any], start_eval: dict[str, Any], protocol: LongProtocol, kind: str) -> int | None:
    """First tracked generation batch at which the run has collapsed (``kind``: "coverage" = validation Pass@64 over
    all buckets below ``coverage_collapse_fraction`` of the start's; "entropy" = validation token entropy below
    ``entropy_collapse_fraction`` of the start's), or None."""
    top = f"pass@{protocol.track_samples}"
    for entry in run["tracked"]:
        val, ref = entry["val"]["all"], start_eval["val"]["all"]
        if kind == "coverage" and val[top] < protocol.coverage_collapse_fraction * ref[top]:
            return entry["generation_batch"]
        if kind == "entropy" and val["entropy"] < protocol.entropy_collapse_fraction * ref["entropy"]:
            return entry["generation_batch"]
    return None


def signal_series(run: dict[str, Any], name: str) -> list[float | None]:
    if name == "quantile_gap":
        return [s["q_beta"] - s["q_alpha"] if "q_beta" in s else None for s in run["batch_signals"]]
    return [s.get(name) for s in run["batch_signals"]]


def guard_alarm(series: list[float | None], direction: str, threshold: float, patience: int) -> int | None:
    """The generation batch (1-based) at which ``series`` has been past ``threshold`` for ``patience`` batches in a
    row, or None. A missing value (e.g. no correlation in a batch without variance) breaks no streak and adds none."""
    streak = 0
    for i, value in enumerate(series, start=1):
        if value is None:
            continue
        past = value >= threshold if direction == ">=" else value <= threshold
        streak = streak + 1 if past else 0
        if streak >= patience:
            return i
    return None


def guard_table(
    all_runs: dict[str, dict[str, dict[str, Any]]], start_evals: dict[str, Any], protocol: LongProtocol
) -> list[dict[str, Any]]:
    """For every candidate (signal, threshold): over every finished run of both starts, how many coverage collapses
    (see :func:`collapse_batch`) it announced before they happened (and by how many
    batches), how many it missed, and which runs that never collapsed it alarmed on."""
    rows = []
    candidates = [(name, rule, False) for name, rule in GUARD_CANDIDATES.items()]
    candidates += [(name, rule, True) for name, rule in POST_HOC_GUARD_CANDIDATES.items()]
    for name, (direction, thresholds), post_hoc in candidates:
        for threshold in thresholds:
            caught, missed, false_alarms, quiet, leads = [], [], [], 0, []
            for start, runs in all_runs.items():
                for run_key, run in runs.items():
                    series = signal_series(run, name)
                    if all(v is None for v in series):
                        continue
                    alarm = guard_alarm(series, direction, threshold, GUARD_PATIENCE)
                    collapsed = collapse_batch(run, start_evals[start], protocol, "coverage")
                    if collapsed is None:
                        if alarm is None:
                            quiet += 1
                        else:
                            false_alarms.append(f"{start}/{run_key}")
                    elif alarm is not None and alarm <= collapsed:
                        caught.append(f"{start}/{run_key}")
                        leads.append(collapsed - alarm)
                    else:
                        missed.append(f"{start}/{run_key}")
            rows.append(
                {
                    "signal": name,
                    "rule": f"{direction} {threshold:g}",
                    "post_hoc": post_hoc,
                    "caught": caught,
                    "missed": missed,
                    "false_alarms": false_alarms,
                    "quiet_healthy": quiet,
                    "median_lead_batches": statistics.median(leads) if leads else None,
                }
            )
    return rows


def _by_method(run_keys: list[str]) -> str:
    """``3 (RiskPO (paper) x2 low, ...)``: how many runs, and which method and start they were."""
    if not run_keys:
        return "0"
    counts: dict[str, int] = {}
    for key in run_keys:
        start, name = key.split("/")
        label = f"{METHOD_LABELS[name.split('-lr')[0]]}, lr {name.split('-lr')[1].split('-seed')[0]}, {start}"
        counts[label] = counts.get(label, 0) + 1
    return f"{len(run_keys)} (" + "; ".join(f"{label} x{n}" for label, n in counts.items()) + ")"


def guard_lines(guard: list[dict[str, Any]], title: str) -> list[str]:
    lines = [
        title,
        "",
        f"Every finished run of both starts; a rule fires when the signal stays past its threshold for "
        f"{GUARD_PATIENCE} training batches in a row. Signals marked * were added post hoc.",
        "",
        "| signal | rule | collapses caught (before they happen) | missed | false alarms | healthy runs left "
        "quiet | median lead (batches) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in guard:
        lead = row["median_lead_batches"]
        cells = [
            row["signal"] + ("*" if row["post_hoc"] else ""),
            row["rule"],
            _by_method(row["caught"]),
            _by_method(row["missed"]),
            _by_method(row["false_alarms"]),
            str(row["quiet_healthy"]),
            "-" if lead is None else str(lead),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# --- the verdicts ----------------------------------------------------------------------------------------------------


def equal_pass1_bins(
    runs: list[dict[str, Any]], other: list[dict[str, Any]], top: str, width: float = 0.02
) -> list[dict[str, Any]]:
    """Every tracked validation point of two methods (all learning rates and seeds), binned by Pass@1: in each bin both
    methods reach, the mean token entropy and Pass@``top`` of each."""

    def points(rs):
        return [
            (e["val"]["all"]["pass@1"], e["val"]["all"]["entropy"], e["val"]["all"][top])
            for r in rs
            for e in r["tracked"]
        ]

    bins: dict[int, tuple[list, list]] = {}
    for side, pts in enumerate((points(runs), points(other))):
        for p1, entropy, cover in pts:
            bins.setdefault(int(p1 / width), ([], []))[side].append((entropy, cover))
    rows = []
    for b, (a, o) in sorted(bins.items()):
        if a and o:
            rows.append(
                {
                    "pass@1": f"[{b * width:.2f}, {(b + 1) * width:.2f})",
                    "n": (len(a), len(o)),
                    "entropy": (statistics.fmean(x[0] for x in a), statistics.fmean(x[0] for x in o)),
                    top: (statistics.fmean(x[1] for x in a), statistics.fmean(x[1] for x in o)),
                }
            )
    return rows


def solved_sets(runs: list[dict[str, Any]], every_seed: bool) -> set[tuple[str, int]]:
    """Test problems (bucket, index) with at least one correct sample out of 64: in any seed, or in every seed."""
    sets = [{(b, i) for b in BUCKETS for i, c in enumerate(r["test"][b]["counts"]) if c > 0} for r in runs]
    if not sets:
        return set()
    return set.intersection(*sets) if every_seed else set.union(*sets)


def verdict_numbers(
    protocol: LongProtocol,
    start_eval: dict[str, Any],
    by_method: dict[str, list[dict[str, Any]]],
    all_runs: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    top = f"pass@{protocol.lm.eval_samples}"
    track_top = f"pass@{protocol.track_samples}"
    out: dict[str, Any] = {"entropy": {}, "coverage": {}, "gap_by_k": {}, "equal_pass1": {}, "solved": {}}
    ref_entropy = start_eval["val"]["all"]["entropy"]
    for m, rs in by_method.items():
        finals = [r["tracked"][-1]["val"]["all"]["entropy"] for r in rs if r["tracked"]]
        minima = [min(e["val"]["all"]["entropy"] for e in r["tracked"]) for r in rs if r["tracked"]]
        out["entropy"][m] = {
            "final_over_start": [f / ref_entropy for f in finals],
            "min_over_start": [x / ref_entropy for x in minima],
            "entropy_collapses": sum(collapse_batch(r, start_eval, protocol, "entropy") is not None for r in rs),
            "coverage_collapses": sum(collapse_batch(r, start_eval, protocol, "coverage") is not None for r in rs),
            "seeds": len(rs),
        }
        out["coverage"][m] = {
            b: [r["test"][b][top] - start_eval["test"][b][top] for r in rs] for b in (*BUCKETS, "all")
        }
    for a, b in COMPARISONS:
        if a not in by_method or b not in by_method:
            continue
        key = f"{a} vs {b}"
        out["gap_by_k"][key] = {
            k: [
                statistics.fmean(r["test"]["all"][f"pass@{k}"] for r in by_method[a])
                - statistics.fmean(r["test"]["all"][f"pass@{k}"] for r in by_method[b])
            ]
            for k in SHOWN_KS
            if k <= protocol.lm.eval_samples
        }
        same = [r for r in all_runs.values() if r["method"] == a]
        ref = [r for r in all_runs.values() if r["method"] == b]
        out["equal_pass1"][key] = equal_pass1_bins(same, ref, track_top)
        out["solved"][key] = {
            "any_seed": {
                "only_" + a: len(solved_sets(by_method[a], False) - solved_sets(by_method[b], False)),
                "only_" + b: len(solved_sets(by_method[b], False) - solved_sets(by_method[a], False)),
            },
            "every_seed": {
                "only_" + a: len(solved_sets(by_method[a], True) - solved_sets(by_method[b], False)),
                "only_" + b: len(solved_sets(by_method[b], True) - solved_sets(by_method[a], False)),
            },
        }
    return out


# --- markdown --------------------------------------------------------------------------------------------------------


def _start_section(
    protocol: LongProtocol,
    start: str,
    sft: dict[str, Any],
    start_eval: dict[str, Any],
    runs: dict[str, dict[str, Any]],
    by_method: dict[str, list[dict[str, Any]]],
    verdicts: dict[str, Any],
    methods: list[str],
) -> list[str]:
    """One start's markdown: the start, the grid, the test tables, the best checkpoints and the verdict numbers."""
    return [
        *_start_table(protocol, start, sft, start_eval),
        *_grid_table(protocol, start_eval, runs, by_method, methods),
        *_test_tables(protocol, start_eval, by_method),
        *_best_checkpoint_table(protocol, by_method),
        *_verdict_tables(protocol, verdicts),
    ]


def _start_table(protocol: LongProtocol, start: str, sft: dict[str, Any], start_eval: dict[str, Any]) -> list[str]:
    """Where the start comes from, and its validation and test figures per bucket."""
    cfg = protocol.lm
    top = f"pass@{cfg.eval_samples}"
    if start == "low":
        origin = f"the short protocol's SFT start ({sft['steps']} SFT steps)"
    else:
        origin = (
            f"the low start's SFT continued for {sft['extra_steps']} more steps; rule: {sft['rule']}; target "
            f"{'reached' if sft['reached_target'] else 'NOT reached'}; RL prompts from the "
            f"{', '.join(f'{d}-digit' for d in protocol.moderate_rl_buckets)} bucket only"
        )
    lines = [
        f"## Start `{start}`: {origin}",
        "",
        "| split | "
        + " | ".join(f"{b} Pass@1 | {b} Pass@{cfg.eval_samples} | {b} entropy" for b in (*BUCKETS, "all"))
        + " |",
        "|---" * (3 * len(BUCKETS) + 4) + "|",
    ]
    for split in ("val", "test"):
        cells = [
            f"{start_eval[split][b]['pass@1']:.3f} | {start_eval[split][b][top]:.3f} | "
            f"{start_eval[split][b]['entropy']:.3f}"
            for b in (*BUCKETS, "all")
        ]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    return lines


def _grid_table(
    protocol: LongProtocol,
    start_eval: dict[str, Any],
    runs: dict[str, dict[str, Any]],
    by_method: dict[str, list[dict[str, Any]]],
    methods: list[str],
) -> list[str]:
    """The learning-rate grid and the chosen rate per method."""
    cfg = protocol.lm
    chosen = {m: rs[0]["lr"] for m, rs in by_method.items() if rs}
    lines = [
        "",
        f"### The learning-rate grid (seed {cfg.grid_seed}; selection: {LONG_SELECTION_CRITERION})",
        "",
        "| method | lr | val Pass@1 | val Pass@16 | criterion | chosen | best val batch | entropy / start | "
        "coverage collapse at | entropy collapse at | train min (mean load) |",
        "|---" * 11 + "|",
    ]
    for m in methods:
        for lr in cfg.learning_rates:
            r = runs.get(run_name(m, lr, cfg.grid_seed))
            if r is None:
                lines.append(f"| {METHOD_LABELS[m]} | {lr:g} | not finished | | | | | | | | |")
                continue
            val = r["tracked"][-1]["val"]["all"]
            pass16 = val[selection_k(r["tracked"][-1]["val"])]
            lines.append(
                f"| {METHOD_LABELS[m]} | {lr:g} | {val['pass@1']:.3f} | {pass16:.3f} | "
                f"{r['selection_score']:.3f} | {'yes' if chosen.get(m) == lr else ''} | "
                f"{r['best_val_generation_batch']} | {val['entropy'] / start_eval['val']['all']['entropy']:.2f} | "
                f"{collapse_batch(r, start_eval, protocol, 'coverage') or '-'} | "
                f"{collapse_batch(r, start_eval, protocol, 'entropy') or '-'} | {run_time(r)} |"
            )
    return lines


def _test_tables(
    protocol: LongProtocol, start_eval: dict[str, Any], by_method: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """Test Pass@k at the chosen rate, in all and per bucket."""
    cfg = protocol.lm
    top = f"pass@{cfg.eval_samples}"
    shown = [k for k in SHOWN_KS if k <= cfg.eval_samples]
    lines = [
        "",
        "### Test at the chosen learning rate (mean ± std over seeds)",
        "",
        "| method | lr | seeds | " + " | ".join(f"Pass@{k}" for k in shown) + " | val entropy (end) |",
        "|---" * (len(shown) + 4) + "|",
        "| start | | | "
        + " | ".join(f"{start_eval['test']['all'][f'pass@{k}']:.3f}" for k in shown)
        + f" | {start_eval['val']['all']['entropy']:.3f} |",
    ]
    for m, rs in by_method.items():
        cells = [_fmt([r["test"]["all"][f"pass@{k}"] for r in rs]) for k in shown]
        ent = _fmt([r["tracked"][-1]["val"]["all"]["entropy"] for r in rs])
        lines.append(f"| {METHOD_LABELS[m]} | {rs[0]['lr']:g} | {len(rs)} | " + " | ".join(cells) + f" | {ent} |")
    lines += [
        "",
        f"### Test per bucket: Pass@1 / Pass@{cfg.eval_samples} (chosen lr)",
        "",
        "| method | " + " | ".join(f"{b} Pass@1 | {b} Pass@{cfg.eval_samples}" for b in BUCKETS) + " |",
        "|---" * (2 * len(BUCKETS) + 1) + "|",
        "| start | "
        + " | ".join(f"{start_eval['test'][b]['pass@1']:.3f} | {start_eval['test'][b][top]:.3f}" for b in BUCKETS)
        + " |",
    ]
    for m, rs in by_method.items():
        cells = [
            f"{_fmt([r['test'][b]['pass@1'] for r in rs])} | {_fmt([r['test'][b][top] for r in rs])}" for b in BUCKETS
        ]
        lines.append(f"| {METHOD_LABELS[m]} | " + " | ".join(cells) + " |")
    return lines


def _best_checkpoint_table(protocol: LongProtocol, by_method: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The best validation checkpoint, where it is not the last."""
    cfg = protocol.lm
    top = f"pass@{cfg.eval_samples}"
    best_rows = [(m, r) for m, rs in by_method.items() for r in rs if "best_val_test" in r]
    if not best_rows:
        return []
    lines = [
        "",
        "### The best validation checkpoint, where it is not the last",
        "",
        f"| method | seed | best at batch | test Pass@1 (best / last) | test Pass@{cfg.eval_samples} (best / last) |",
        "|---|---|---|---|---|",
    ]
    for m, r in best_rows:
        lines.append(
            f"| {METHOD_LABELS[m]} | {r['seed']} | {r['best_val_generation_batch']} | "
            f"{r['best_val_test']['all']['pass@1']:.3f} / {r['test']['all']['pass@1']:.3f} | "
            f"{r['best_val_test']['all'][top]:.3f} / {r['test']['all'][top]:.3f} |"
        )
    return lines


def _verdict_tables(protocol: LongProtocol, verdicts: dict[str, Any]) -> list[str]:
    """The verdict numbers: entropy and collapses, and, with two methods, the gap, the solved sets and the figures at
    equal Pass@1."""
    cfg = protocol.lm
    track_top = f"pass@{protocol.track_samples}"
    lines = [
        "",
        "### Verdict numbers",
        "",
        "Entropy (validation, all buckets) relative to the start; collapses counted over seeds at the chosen lr:",
        "",
        "| method | final / start | min along training / start | entropy collapses | coverage collapses "
        f"| test Pass@{cfg.eval_samples} - start: " + " / ".join((*BUCKETS, "all")) + " |",
        "|---|---|---|---|---|---|",
    ]
    for m, e in verdicts["entropy"].items():
        cover = " / ".join(_fmt(verdicts["coverage"][m][b]) for b in (*BUCKETS, "all"))
        lines.append(
            f"| {METHOD_LABELS[m]} | {_fmt(e['final_over_start'], 2)} | {_fmt(e['min_over_start'], 2)} | "
            f"{e['entropy_collapses']}/{e['seeds']} | {e['coverage_collapses']}/{e['seeds']} | {cover} |"
        )
    if verdicts["gap_by_k"]:
        ks = list(next(iter(verdicts["gap_by_k"].values())))
        lines += [
            "",
            "Test Pass@k difference of the seed means (does the gap widen with k?):",
            "",
            "| comparison | " + " | ".join(f"k={k}" for k in ks) + " |",
            "|---" * (len(ks) + 1) + "|",
        ]
        for key, gaps in verdicts["gap_by_k"].items():
            lines.append(f"| {key} | " + " | ".join(f"{gaps[k][0]:+.3f}" for k in ks) + " |")
        lines += [
            "",
            "Test problems solved (at least one of 64 samples right) by one method and never by the other "
            "(any seed: union over seeds; every seed: solved in all of the first method's seeds, none of the "
            "other's):",
            "",
            "| comparison | any seed | every seed |",
            "|---|---|---|",
        ]
        for key, counts in verdicts["solved"].items():
            lines.append(
                f"| {key} | "
                + " | ".join(", ".join(f"{k} {v}" for k, v in counts[x].items()) for x in ("any_seed", "every_seed"))
                + " |"
            )
        lines += [
            "",
            f"At equal validation Pass@1 (every tracked point of every lr and seed, bins of 0.02): entropy "
            f"and Pass@{protocol.track_samples}, first method / second:",
            "",
            f"| comparison | Pass@1 bin | points | entropy | Pass@{protocol.track_samples} |",
            "|---|---|---|---|---|",
        ]
        for key, rows in verdicts["equal_pass1"].items():
            for row in rows:
                lines.append(
                    f"| {key} | {row['pass@1']} | {row['n'][0]} / {row['n'][1]} | "
                    f"{row['entropy'][0]:.3f} / {row['entropy'][1]:.3f} | "
                    f"{row[track_top][0]:.3f} / {row[track_top][1]:.3f} |"
                )
    return lines


def run_timing(all_runs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """What the runs recorded of their own time and load; nothing of the moment the report is written, so the
    report is a function of the cached runs alone."""
    runs = [r for runs in all_runs.values() for r in runs.values()]
    loads = [r["load_average"]["mean"] for r in runs if r.get("load_average")]
    return {
        "source": "train_seconds and load_average of each run file",
        "runs": len(runs),
        "train_seconds_total": sum(r["train_seconds"] for r in runs),
        "runs_with_load": len(loads),
        "mean_load_of_runs_with_load": sum(loads) / len(loads) if loads else None,
    }


def timing_line(timing: dict[str, Any]) -> str:
    load = (
        f"{timing['runs_with_load']} of them recorded the 1-minute load while they ran (mean "
        f"{timing['mean_load_of_runs_with_load']:.1f})"
        if timing["runs_with_load"]
        else "none recorded its load"
    )
    return (
        f"Timing: as each run recorded it in its run file (`train_seconds`, `load_average`), on CPU cores shared "
        f"with other jobs; {timing['runs']} runs, {timing['train_seconds_total'] / 3600:.1f} h of training in all; "
        f"{load}. The run files do not record the machine."
    )


def report(protocol: LongProtocol, out: Path, starts: list[str], methods: list[str]):
    from .long_figures import plot_all

    lines = [
        "# Long-horizon tiny-LM study",
        "",
        f"{protocol.lm.generation_batches} generation batches x {protocol.lm.prompts_per_generation} prompts x "
        f"{protocol.lm.num_generations} completions, {protocol.lm.updates_per_generation} updates each; lr grid "
        f"{list(protocol.lm.learning_rates)} at seed {protocol.lm.grid_seed}; validation tracked every "
        f"{protocol.eval_every} batches ({protocol.track_samples} samples per problem); test at the end with "
        f"{protocol.lm.eval_samples} samples per problem. Collapse: coverage = validation Pass@"
        f"{protocol.track_samples} below {protocol.coverage_collapse_fraction:g} x the start's; entropy = "
        f"validation token entropy below {protocol.entropy_collapse_fraction:g} x the start's.",
        "",
    ]
    payload: dict[str, Any] = {"protocol": asdict(protocol), "starts": {}}
    all_runs, start_evals, figure_inputs = {}, {}, {}
    for start in starts:
        eval_path, sft_path = out / start / "start_eval.json", out / start / "sft_summary.json"
        if not json_exists(eval_path) or not sft_path.exists():
            lines += [f"## Start `{start}`: not ready yet", ""]
            continue
        start_eval, sft = read_json(eval_path), json.loads(sft_path.read_text())
        runs = load_long_runs(out, start)
        by_method = chosen_runs(protocol, out, start, methods, runs)
        verdicts = verdict_numbers(protocol, start_eval, by_method, runs)
        lines += _start_section(protocol, start, sft, start_eval, runs, by_method, verdicts, methods) + [""]
        all_runs[start], start_evals[start] = runs, start_eval
        figure_inputs[start] = (start_eval, by_method)
        payload["starts"][start] = {
            "finished": sorted(runs),
            "chosen_lr": {m: rs[0]["lr"] for m, rs in by_method.items() if rs},
            "seeds": {m: [r["seed"] for r in rs] for m, rs in by_method.items()},
            "verdicts": verdicts,
            "train_minutes": {n: r["train_seconds"] / 60 for n, r in runs.items()},
        }
    guard = guard_table(all_runs, start_evals, protocol)
    payload["guard_candidates"] = guard
    lines += guard_lines(guard, "## Which batch signal announces a coverage collapse?")
    payload["timing"] = run_timing(all_runs)
    lines += ["", timing_line(payload["timing"])]
    text = "\n".join(lines)
    write_results("lm_long", payload, text, out)
    plot_all(protocol, figure_inputs, out)
    print(text)
    return payload
