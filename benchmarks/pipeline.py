"""The studies' one pipeline: a protocol plans its runs as :class:`Job` s, :func:`run_jobs` runs them, and every
protocol's command line comes from :func:`study_parser`.

A protocol is data and functions: its planned jobs in order (read again whenever a run ends, so a grid that finishes
can decide the rates of later runs), how to run one (a top-level function, so a fresh process can import it), and
where each run's file goes. The runner owns the loop:

- each run in a fresh ``spawn`` process with one torch thread, ``workers`` at once, in plan order (``workers=0``: one
  at a time in this process);
- a run is cached when its file exists; the protocol's run function writes that file only when the run completes, so
  a killed run leaves nothing and simply starts again;
- a rerun skips every cached run (resume); a run that fails is reported and not retried in the same pass, and so is
  one whose process dies outright (a signal, out of memory): the runner never waits on a dead process.

Concurrency changes no result: every run is seeded and uses one torch thread; only its recorded seconds and load
differ.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, json_exists


@dataclass(frozen=True)
class Job:
    """One run of a study: ``run(*args)`` writes ``path``, and only once it completes. Jobs are equal when their
    files are."""

    key: str  # how the log names the run
    path: Path
    run: Callable[..., Any] = field(compare=False, repr=False)
    args: tuple = field(default=(), compare=False, repr=False)


def write_json(path: Path, payload: Any) -> None:
    """A run's file, written atomically: a killed run leaves no half-written cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload) + "\n")
    tmp.replace(path)


def quiet_environment() -> None:
    """No Hub, no trackers, no tokenizer threads, no progress bars. Called by the entry points and each worker before datasets,
    transformers or TRL are imported."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def one_thread() -> None:
    """The worker's set-up: the quiet environment and one torch thread."""
    quiet_environment()
    import torch

    torch.set_num_threads(1)
    if "datasets" in sys.modules:  # imported before the environment was set: its progress bars are on
        sys.modules["datasets"].disable_progress_bars()


def attempt(job: Job) -> str:
    """Run ``job``; a failure is printed and reported in the returned line, never raised."""
    started = time.perf_counter()
    try:
        job.run(*job.args)
    except Exception as error:  # one failed run must not stop the others; the next pass runs it again
        traceback.print_exc()
        return f"{job.key}: FAILED {type(error).__name__}: {error}"
    return f"{job.key}: ok ({(time.perf_counter() - started) / 60:.1f} min)"


def run_jobs(plan: Callable[[], Sequence[Job]], workers: int, tag: str) -> list[str]:
    """Every uncached job of ``plan()`` in its order, ``workers`` at once in fresh processes (0: in this process);
    ``plan`` is called again whenever a run ends. Returns one log line per run."""
    log: list[str] = []
    failed: set[Path] = set()

    def pending(busy: set[Path]) -> list[Job]:
        return [j for j in plan() if j.path not in failed and j.path not in busy and not json_exists(j.path)]

    def finished(job: Job, line: str) -> None:
        print(f"[{tag}] {line}", flush=True)
        log.append(line)
        if not json_exists(job.path):
            failed.add(job.path)

    if workers == 0:
        while jobs := pending(set()):
            print(f"[{tag}] {len(jobs)} runs to go; start {jobs[0].key}", flush=True)
            finished(jobs[0], attempt(jobs[0]))
        return log
    running: dict[Path, tuple[Job, Future]] = {}
    pool = _fresh_pool(workers)
    try:
        while True:
            jobs = pending(set(running))
            to_go = len(jobs) + len(running)
            for job in jobs[: workers - len(running)]:
                print(f"[{tag}] {to_go} runs to go; start {job.key}", flush=True)
                running[job.path] = (job, pool.submit(attempt, job))
            if not running:
                return log
            done, _ = wait([future for _, future in running.values()], return_when=FIRST_COMPLETED)
            broken = False
            for path, (job, future) in list(running.items()):
                if future in done:
                    del running[path]
                    try:
                        line = future.result()
                    except BrokenProcessPool:  # a worker died outright: every run in the pool is lost with it
                        broken = True  # each is reported here and runs again on the next pass
                        line = f"{job.key}: FAILED its process died (killed by a signal, e.g. out of memory)"
                    finished(job, line)
            if broken:
                pool.shutdown(wait=False, cancel_futures=True)
                pool = _fresh_pool(workers)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _fresh_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawn processes on one torch thread each, a fresh one per run."""
    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=one_thread, max_tasks_per_child=1
    )


def study_parser(doc: str | None, folder: str, workers: int = 1, reference: str | None = None):
    """The command line every protocol shares: ``--smoke``, ``--out``, ``--workers``, ``--report-only`` (and
    ``--reference`` for a study that reuses another's runs). A protocol adds its own options to the returned parser;
    :func:`parse_study_args` fills in the folders."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(folder=folder, reference_folder=reference)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"Output folder (default benchmarks/results/{folder}, or {folder}-smoke with --smoke). Models go under "
        "it to models/ folders, which git ignores.",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=workers,
        help=f"Runs at once, each in a fresh process with one torch thread; 0: one at a time in this process "
        f"(default {workers}).",
    )
    parser.add_argument("--report-only", action="store_true", help="Only the report, from the cached runs.")
    if reference is not None:
        parser.add_argument(
            "--reference",
            type=Path,
            default=None,
            help=f"The {reference} study's folder, whose runs are reused (default benchmarks/results/{reference}; "
            "with --smoke, the output folder, where they are run).",
        )
    return parser


def parse_study_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed options with ``out`` (created) and ``reference`` resolved; the quiet environment set and this
    process on one torch thread, before the study imports datasets, transformers or TRL."""
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error(f"--workers must be 0 or more, not {args.workers}.")
    args.out = args.out or RESULTS_DIR / (f"{args.folder}-smoke" if args.smoke else args.folder)
    if args.reference_folder is not None:
        args.reference = args.reference or (args.out if args.smoke else RESULTS_DIR / args.reference_folder)
    args.out.mkdir(parents=True, exist_ok=True)
    one_thread()
    return args
