"""Tabular study, the baseline cells: RiskPO's paper advantage minus a per-prompt leave-one-out baseline
(``advantage_baseline="loo"``) in the tabular study's cells, with Adam and with plain SGD.

    python -m benchmarks.tabular_baseline            # every cell, cached under benchmarks/results/tabular_baseline/runs
    python -m benchmarks.tabular_baseline --smoke    # trivial size, for the test suite
    python -m benchmarks.tabular_baseline --report-only   # the report from the cached runs

Fixed before any run (:class:`TabularBaselineConfig`): the tabular study's task, starting policy, steps, batch sizes,
seeds and metrics (:class:`~benchmarks.tabular_study.TabularConfig`). With Adam, ``riskpo_loo`` runs on that study's
learning-rate grid and is compared with its cached runs of the other methods (``--reference``). With SGD, which keeps
the advantage's scale where Adam divides it out, every compared method runs on ``sgd_learning_rates``: the loss is a
mean over ``P * G`` answers, so a question's logits move by about ``lr * A / P`` per step; the grid spans that step
from ~0.001 to ~3 logits for ``P`` from 200 to 10. Each cell is reported as it comes (seed mean ± std), with the
tabular study's selection rule for a one-line summary per method and batch size. After the first results, in which
every method chose the grid's top SGD rate in every cell, ``sgd_added_learning_rates`` were added and are reported
apart: the choice is shown within the fixed grid and with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks._common import json_exists, mean_std, write_results
from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser
from benchmarks.tabular_study import (
    EXTRA_METHODS,
    METHOD_LABELS,
    TabularConfig,
    cached_runs,
    policy_metrics,
    run_cell,
    run_name,
    starting_logits,
)

LABELS = {**METHOD_LABELS, **EXTRA_METHODS}


@dataclass(frozen=True)
class TabularBaselineConfig:
    tabular: TabularConfig = TabularConfig()
    method: str = "riskpo_loo"
    compared: tuple[str, ...] = ("grpo", "riskpo", "riskpo_authors")
    sgd_learning_rates: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0, 30.0)
    # Added after the first results, because every method chose the grid's top SGD rate in every cell; reported
    # apart, with the choice both within the grid fixed before the runs and with these.
    sgd_added_learning_rates: tuple[float, ...] = (100.0, 300.0)

    def learning_rates(self, optimizer: str, added: bool = True) -> tuple[float, ...]:
        if optimizer == "adam":
            return self.tabular.learning_rates
        return self.sgd_learning_rates + (self.sgd_added_learning_rates if added else ())

    def scaled_down(self) -> TabularBaselineConfig:
        return replace(
            self, tabular=self.tabular.scaled_down(), sgd_learning_rates=(1.0,), sgd_added_learning_rates=(3.0,)
        )


def run_file(optimizer: str, method: str, num_prompts: int, lr: float, seed: int) -> str:
    name = run_name(method, num_prompts, lr, seed)
    return f"{name}.json" if optimizer == "adam" else f"{name}-sgd.json"


def run_path(
    cfg: TabularBaselineConfig,
    out: Path,
    reference: Path,
    optimizer: str,
    method: str,
    num_prompts: int,
    lr: float,
    seed: int,
) -> Path:
    """Adam runs of the tabular study's own methods are its cached runs; every other run is this study's."""
    folder = reference if optimizer == "adam" and method != cfg.method else out
    return folder / "runs" / run_file(optimizer, method, num_prompts, lr, seed)


def cells(cfg: TabularBaselineConfig) -> list[tuple[str, str, int, float]]:
    return [
        (optimizer, method, p, lr)
        for optimizer in ("adam", "sgd")
        for method in (cfg.method, *cfg.compared)
        for p in cfg.tabular.prompts_per_step
        for lr in cfg.learning_rates(optimizer)
    ]


def jobs(cfg: TabularBaselineConfig, out: Path, reference: Path) -> list[Job]:
    """Every run of every cell; the tabular study's Adam runs are read from ``reference``, never run here unless it
    is the output folder (the smoke size)."""
    planned = []
    for optimizer, method, p, lr in cells(cfg):
        for seed in cfg.tabular.seeds:
            path = run_path(cfg, out, reference, optimizer, method, p, lr, seed)
            args = (path, method, p, lr, seed, cfg.tabular, optimizer)
            planned.append(Job(f"{optimizer}|{method}|{p}|{lr:g}|{seed}", path, run_cell, args))
    return planned


def check_reference(planned: list[Job], out: Path, reference: Path) -> None:
    missing = [j.path for j in planned if j.path.parent.parent == reference != out and not json_exists(j.path)]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: run python -m benchmarks.tabular_study first.")


def summarize(cfg: TabularBaselineConfig, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Seed mean ± std of every cell, and per optimizer, method and batch size the lr with the best seed mean of
    (Pass@1 + Pass@16) / 2 (the tabular study's rule)."""
    top = f"pass@{cfg.tabular.ks[-1]}"
    keys = ("pass@1", top, f"hard/{top}", "easy/pass@1", "entropy")
    table = {}
    for optimizer, method, p, lr in cells(cfg):
        finals = [runs[f"{optimizer}|{method}|{p}|{lr:g}|{s}"]["final"] for s in cfg.tabular.seeds]
        table[f"{optimizer}|{method}|{p}|{lr:g}"] = {key: mean_std([f[key] for f in finals]) for key in keys}
    selected = {}
    for optimizer, added in (("adam", False), ("sgd", False), ("sgd", True)):
        grid = f"{optimizer}+added" if added else optimizer
        for method in (cfg.method, *cfg.compared):
            for p in cfg.tabular.prompts_per_step:

                def score(lr, optimizer=optimizer, method=method, p=p):
                    cell = table[f"{optimizer}|{method}|{p}|{lr:g}"]
                    return (cell["pass@1"][0] + cell[top][0]) / 2

                selected[f"{grid}|{method}|{p}"] = max(cfg.learning_rates(optimizer, added), key=score)
    return {"cells": table, "selected_lr": selected}


def run_timing(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the runs recorded of their own time; nothing of the moment the report is written."""
    return {
        "source": "seconds of each run file",
        "runs": len(runs),
        "seconds_total": sum(r.get("seconds", 0.0) for r in runs.values()),
    }


def markdown(cfg: TabularBaselineConfig, summary: dict[str, Any], timing: dict[str, Any]) -> str:
    tab = cfg.tabular
    top = tab.ks[-1]
    theta0, start_p = starting_logits(tab)
    start = policy_metrics(theta0, start_p, tab.ks)
    methods = (cfg.method, *cfg.compared)
    lines = [
        "# Tabular study, the baseline cells: `loo` with Adam and with SGD",
        "",
        f"The tabular study's task ({tab.num_questions} questions x {tab.num_answers} answers, one correct; "
        f"{tab.steps} steps, G={tab.num_generations}, seeds {list(tab.seeds)}; mean ± std over seeds). Start: "
        f"Pass@1 {start['pass@1']:.3f}, Pass@{top} {start[f'pass@{top}']:.3f}, hard Pass@{top} "
        f"{start[f'hard/pass@{top}']:.3f}, entropy {start['entropy']:.3f}. Adam cells of the other methods are the "
        "tabular study's cached runs; every SGD run and every `loo` run is this study's.",
        "",
    ]
    added = ", ".join(f"{lr:g}" for lr in cfg.sgd_added_learning_rates)
    titles = {
        "adam": "ADAM",
        "sgd": "SGD, within the grid fixed before the runs",
        "sgd+added": f"SGD, with the rates added after the first results ({added})",
    }
    for grid, title in titles.items():
        optimizer = grid.split("+")[0]
        lines += [
            f"## {title}: selected lr per method and batch size (best seed mean of (Pass@1 + Pass@{top}) / 2)",
            "",
            "| prompts | " + " | ".join(LABELS[m] for m in methods) + " |",
            "|---" * (len(methods) + 1) + "|",
        ]
        for p in tab.prompts_per_step:
            row = []
            for m in methods:
                lr = summary["selected_lr"][f"{grid}|{m}|{p}"]
                c = summary["cells"][f"{optimizer}|{m}|{p}|{lr:g}"]
                row.append(
                    f"lr {lr:g}: P@1 {c['pass@1'][0]:.3f}, P@{top} {c[f'pass@{top}'][0]:.3f}, hard "
                    f"P@{top} {c[f'hard/pass@{top}'][0]:.3f}, H {c['entropy'][0]:.2f}"
                )
            lines.append(f"| {p} | " + " | ".join(row) + " |")
        lines.append("")
        if grid == "sgd":
            continue
        lines += [
            f"## {optimizer.upper()}: every cell (final policy; `*` the choice above)",
            "",
            f"| method | prompts | lr | Pass@1 | Pass@{top} | hard Pass@{top} | easy Pass@1 | entropy |",
            "|---" * 8 + "|",
        ]
        for m in methods:
            for p in tab.prompts_per_step:
                for lr in cfg.learning_rates(optimizer):
                    c = summary["cells"][f"{optimizer}|{m}|{p}|{lr:g}"]
                    mark = " *" if summary["selected_lr"][f"{grid}|{m}|{p}"] == lr else ""
                    mark += " (added)" if optimizer == "sgd" and lr in cfg.sgd_added_learning_rates else ""
                    lines.append(
                        f"| {LABELS[m]} | {p} | {lr:g}{mark} | "
                        + " | ".join(
                            f"{c[k][0]:.3f} ± {c[k][1]:.3f}"
                            for k in ("pass@1", f"pass@{top}", f"hard/pass@{top}", "easy/pass@1", "entropy")
                        )
                        + " |"
                    )
        lines.append("")
    lines += [
        f"Timing: the {timing['runs']} runs reported (the tabular study's Adam runs included) took "
        f"{timing['seconds_total']:.0f} s in all, one torch thread each, on CPU cores shared with other jobs, as each "
        "run recorded it (`seconds` in its run file). The run files record neither the machine nor its load."
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_study_args(study_parser(__doc__, "tabular_baseline", workers=0, reference="tabular"), argv)
    cfg = TabularBaselineConfig().scaled_down() if args.smoke else TabularBaselineConfig()
    out, reference = args.out, args.reference
    check_reference(jobs(cfg, out, reference), out, reference)
    if not args.report_only:
        run_jobs(lambda: jobs(cfg, out, reference), args.workers, "tabular_baseline")
    runs = cached_runs(jobs(cfg, out, reference))
    summary = summarize(cfg, runs)
    timing = run_timing(runs)
    text = markdown(cfg, summary, timing)
    payload = {"config": asdict(cfg), "timing": timing, **summary}
    write_results("tabular_baseline", payload, text, out)
    print(text)
    return payload


if __name__ == "__main__":
    main()
