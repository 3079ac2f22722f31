"""The baseline study: RiskPO's paper advantage minus a per-prompt leave-one-out baseline
(``advantage_baseline="loo"``) against the paper's advantage, GRPO and the authors' advantage, in the exact protocol's
framework.

One command, resumable (every run is cached as JSON the moment it finishes; a rerun skips what is cached, and a
killed run simply starts again)::

    python -m benchmarks.lm_study.baseline_protocol                 # every run, then the report
    python -m benchmarks.lm_study.baseline_protocol --smoke         # trivial sizes for the test suite
    python -m benchmarks.lm_study.baseline_protocol --report-only   # the report from whatever runs are cached

Everything is fixed in :class:`~benchmarks.lm_study.config.BaselineProtocol`,
:data:`~benchmarks.lm_study.config.BASELINE_CLAIMS` and :data:`~benchmarks.lm_study.config.BASELINE_DEFAULT_RULE`
before the first run. Runs go one at a time, each in a fresh process, in this order: the learning-rate grid from
both starts (seed 0), then seed by seed the chosen rate from both starts, then the equal-lr GRPO control. The
starts, their evaluations and the reference runs are the exact protocol's cached ones (``--reference``); at the
smoke size they are built and run here.
"""

from __future__ import annotations

import argparse
import multiprocessing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
import torch

from benchmarks._common import RESULTS_DIR, json_exists, read_json

from .config import BaselineProtocol, ExactProtocol
from .exact_protocol import Job, evaluate_start, run_job, run_path, start_dirs


@dataclass(frozen=True)
class BaselineJob:
    """One run: ``method`` from ``start`` at ``lr`` with ``seed``, cached under ``folder``."""

    start: str
    method: str
    lr: float
    seed: int
    folder: Path

    def protocol(self, exact: ExactProtocol) -> ExactProtocol:
        """The exact protocol with this run's learning rate, so its runner and paths serve unchanged."""
        return replace(exact, learning_rates=((self.start, ((self.method, self.lr),)),))

    @property
    def job(self) -> Job:
        return Job(self.start, self.method, self.seed)

    def path(self, exact: ExactProtocol) -> Path:
        return run_path(self.protocol(exact), self.folder, self.job)

    def key(self, exact: ExactProtocol) -> str:
        return self.job.key(self.protocol(exact))


def folder_for(protocol: BaselineProtocol, out: Path, reference: Path, start: str, method: str, lr: float) -> Path:
    """Where a run is cached: the exact protocol's folder when it is one of its runs (same method, start and rate),
    else this study's."""
    exact = protocol.exact
    known = method in exact.methods and exact.lr(start, method) == lr
    return reference if known else out


def job(
    protocol: BaselineProtocol, out: Path, reference: Path, start: str, method: str, lr: float, seed: int
) -> BaselineJob:
    return BaselineJob(start, method, lr, seed, folder_for(protocol, out, reference, start, method, lr))


def grid_jobs(protocol: BaselineProtocol, out: Path, reference: Path) -> list[BaselineJob]:
    return [
        job(protocol, out, reference, start, protocol.method, lr, protocol.grid_seed)
        for start in protocol.exact.starts
        for lr in protocol.learning_rates
    ]


def grid_scores(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> dict[float, float | None]:
    """Per grid rate, the final exact validation criterion of the seed-0 run (None: not finished)."""
    scores: dict[float, float | None] = {}
    for lr in protocol.learning_rates:
        path = job(protocol, out, reference, start, protocol.method, lr, protocol.grid_seed).path(protocol.exact)
        scores[lr] = read_json(path)["tracked"][-1]["score"] if json_exists(path) else None
    return scores


def chosen_lr(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> float | None:
    """The grid rate with the best final validation criterion (ties: the smaller), once the grid is complete."""
    scores = grid_scores(protocol, out, reference, start)
    if any(score is None for score in scores.values()):
        return None
    return max(sorted(scores), key=lambda lr: scores[lr])  # max keeps the first (smallest) on ties


def planned_jobs(protocol: BaselineProtocol, out: Path, reference: Path) -> list[BaselineJob]:
    """Every run the study needs that can be named now, in the order they run: the grid; then, per seed, the chosen
    rate from each start whose grid is complete; then the equal-lr control; last any missing reference run."""
    exact = protocol.exact
    jobs = grid_jobs(protocol, out, reference)
    chosen = {start: chosen_lr(protocol, out, reference, start) for start in exact.starts}
    jobs += [
        job(protocol, out, reference, start, protocol.method, chosen[start], seed)
        for seed in exact.seeds
        if seed != protocol.grid_seed
        for start in exact.starts
        if chosen[start] is not None
    ]
    if chosen[protocol.control_start] is not None:
        jobs += [
            job(
                protocol,
                out,
                reference,
                protocol.control_start,
                protocol.control_method,
                chosen[protocol.control_start],
                seed,
            )
            for seed in exact.seeds
        ]
    jobs += [
        job(protocol, out, reference, start, method, exact.lr(start, method), seed)
        for start in exact.starts
        for seed in exact.seeds
        for method in protocol.references
    ]
    unique: dict[Path, BaselineJob] = {}
    for j in jobs:
        unique.setdefault(j.path(exact), j)
    return list(unique.values())


def pending_jobs(protocol: BaselineProtocol, out: Path, reference: Path) -> list[BaselineJob]:
    return [j for j in planned_jobs(protocol, out, reference) if not json_exists(j.path(protocol.exact))]


def _run_job(args) -> str:
    """One run in a worker process: the exact protocol's runner with this run's rate and folder."""
    j, protocol, start_dir = args
    return run_job(j.job, j.protocol(protocol.exact), start_dir, j.folder)


def run_all(protocol: BaselineProtocol, out: Path, reference: Path, dirs: dict[str, Path], workers: int) -> list[str]:
    """Every uncached run, one at a time in :func:`planned_jobs` order (``workers=0``: in this process); the plan is
    read again after each run, since the grid decides the rest. A run that fails is not retried in this call."""
    for start, start_dir in dirs.items():
        evaluate_start(protocol.exact, start, start_dir, reference)
    log: list[str] = []
    failed: set[Path] = set()
    context = multiprocessing.get_context("spawn")
    while True:
        jobs = [j for j in pending_jobs(protocol, out, reference) if j.path(protocol.exact) not in failed]
        if not jobs:
            return log
        j = jobs[0]
        print(f"[baseline] {len(jobs)} runs to go; start {j.key(protocol.exact)}", flush=True)
        if workers == 0:
            line = _run_job((j, protocol, dirs[j.start]))
        else:
            with context.Pool(1, maxtasksperchild=1) as pool:
                line = pool.apply(_run_job, ((j, protocol, dirs[j.start]),))
        print("[baseline]", line, flush=True)
        log.append(line)
        if not json_exists(j.path(protocol.exact)):
            failed.add(j.path(protocol.exact))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from .baseline_report import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Output folder (default benchmarks/results/lm_baseline, or lm_baseline-smoke with --smoke).",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="The exact protocol's folder, whose starts' evaluations and runs are reused (default "
        "benchmarks/results/lm_exact; with --smoke, the output folder).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="1: each run in a fresh process with one torch thread; 0: in this process.",
    )
    parser.add_argument("--report-only", action="store_true", help="Only the report, from the cached runs.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    protocol = BaselineProtocol().scaled_down() if args.smoke else BaselineProtocol()
    out = args.out or RESULTS_DIR / ("lm_baseline-smoke" if args.smoke else "lm_baseline")
    reference = args.reference or (out if args.smoke else RESULTS_DIR / "lm_exact")
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(protocol, out, reference, start_dirs(protocol.exact, reference, args.smoke), args.workers)
    return report(protocol, out, reference)


if __name__ == "__main__":
    main()
