"""The long-horizon protocol: do GRPO's entropy and coverage collapse over training, and does RiskPO's advantage
avoid it? Same task, model and SFT start as the short protocol, 10x its updates, two starts.

One command runs everything, resumable across sessions (every start, start evaluation and run is cached as JSON the
moment it finishes; a rerun skips what is cached and a killed run simply starts again)::

    python -m benchmarks.lm_study.long_protocol                 # both starts, grids, selection, seeds, report
    python -m benchmarks.lm_study.long_protocol --smoke         # trivial sizes for the test suite
    python -m benchmarks.lm_study.long_protocol --report-only   # tables and figures from the finished runs

Everything is fixed in :class:`~benchmarks.lm_study.config.LongProtocol` before the first run: the starts (``low``
= the short protocol's SFT start; ``moderate`` = that SFT continued until the 2-digit validation Pass@1 is >= 0.4,
with RL prompts from that bucket: the paper's regime, most prompts neither all-right nor all-wrong), 600 generation
batches x 4 updates, the learning-rate grid, the selection criterion
(:data:`~benchmarks.lm_study.config.LONG_SELECTION_CRITERION`), the seeds, the validation tracking every 25 generation
batches (Pass@k and the sampling policy's token entropy, 64 samples per problem, per bucket), the test
evaluation at the end (Pass@k, k = 1..64, for the final weights and the best validation checkpoint), and what counts
as a collapse.

Jobs run ``--workers`` at a time (one torch thread each), in a fixed priority: the starts, then per start the
grid, the selected learning rates' seeds, and the optional methods last. A job is scheduled as soon as what it needs
is cached, so both workers stay busy.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
import torch

from benchmarks._common import RESULTS_DIR, json_exists

from .config import LongProtocol
from .run import evaluate_start, run_long_rl, run_name, select_lrs
from .sft import continue_sft, run_sft


@dataclass(frozen=True)
class Job:
    kind: str  # "start" (SFT + start evaluation) or "rl"
    start: str
    method: str = ""
    lr: float = 0.0
    seed: int = 0

    @property
    def key(self) -> str:
        name = run_name(self.method, self.lr, self.seed) if self.kind == "rl" else "sft"
        return f"{self.start}/{name}"


def sft_stage_config(protocol: LongProtocol):
    """The SFT stage of the short protocol exactly (its evaluation sizes drive its stopping rule)."""
    samples = min(16, protocol.lm.eval_samples)
    return replace(protocol.lm, eval_samples=samples, ks=tuple(k for k in range(1, samples + 1)))


def start_ready(protocol: LongProtocol, out: Path, start: str) -> bool:
    d = out / start
    return (
        (d / "sft_summary.json").exists()
        and (d / "models" / "sft" / "config.json").exists()
        and (d / "start_eval.json").exists()
    )


def seeds_of(protocol: LongProtocol, start: str) -> tuple[int, ...]:
    return protocol.lm.test_seeds if start == "low" else protocol.seeds_moderate


def run_cached(out: Path, job: Job) -> bool:
    return json_exists(out / job.start / "runs" / f"{run_name(job.method, job.lr, job.seed)}.json")


def pending_jobs(protocol: LongProtocol, out: Path, starts: list[str], methods: list[str]) -> list[Job]:
    """Every job whose inputs are cached and whose output is not, in priority order."""
    cfg = protocol.lm
    jobs: list[Job] = []
    for start in starts:
        if not start_ready(protocol, out, start):
            needs_low = start == "moderate" and not start_ready(protocol, out, "low")
            if not needs_low:
                jobs.append(Job("start", start))
    core = [m for m in methods if m in protocol.core_methods]
    optional = [m for m in methods if m in protocol.optional_methods]
    for group in (core, optional):
        for start in starts:
            if not start_ready(protocol, out, start):
                continue
            grid = [Job("rl", start, m, lr, cfg.grid_seed) for m in group for lr in cfg.learning_rates]
            jobs += [j for j in grid if not run_cached(out, j)]
            chosen = select_lrs(cfg, out / start, group)
            jobs += [
                j
                for m, lr in chosen.items()
                for s in seeds_of(protocol, start)
                if not run_cached(out, j := Job("rl", start, m, lr, s))
            ]
    return jobs


def run_job(job: Job, protocol: LongProtocol, out: Path) -> str:
    """One job in a worker process (one torch thread); a failure is reported, never raised."""
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    cfg = protocol.lm
    try:
        started = time.perf_counter()
        if job.kind == "start":
            if job.start == "low":
                run_sft(sft_stage_config(protocol), out / "low")
            else:
                continue_sft(
                    sft_stage_config(protocol),
                    out / "low" / "models" / "sft",
                    out / job.start,
                    bucket=protocol.moderate_bucket,
                    target_pass1=protocol.moderate_target_pass1,
                    check_every=protocol.moderate_check_every,
                    check_samples=protocol.moderate_check_samples,
                    max_steps=protocol.moderate_max_steps,
                )
            evaluate_start(cfg, out / job.start, protocol.track_samples)
        else:
            run_long_rl(
                job.method,
                job.lr,
                job.seed,
                cfg,
                out / job.start,
                eval_every=protocol.eval_every,
                track_samples=protocol.track_samples,
                train_buckets=protocol.moderate_rl_buckets if job.start == "moderate" else None,
            )
        return f"{job.key}: ok ({(time.perf_counter() - started) / 60:.1f} min)"
    except Exception as error:  # one failed job must not take the others down; it is rerun next time
        import traceback

        traceback.print_exc()
        return f"{job.key}: FAILED {type(error).__name__}: {error}"


def _run_job(args: tuple[Job, LongProtocol, Path]) -> str:
    return run_job(*args)


def run_all(protocol: LongProtocol, out: Path, starts: list[str], methods: list[str], workers: int) -> list[str]:
    """Keep ``workers`` jobs running until nothing is pending; a job that fails is not retried in this call."""
    log: list[str] = []
    running: dict[str, Any] = {}
    done: set[str] = set()
    context = multiprocessing.get_context("spawn")
    with context.Pool(max(1, workers), maxtasksperchild=1) as pool:
        while True:
            for key, result in list(running.items()):
                if result.ready():
                    line = result.get()
                    print("[long]", line, flush=True)
                    log.append(line)
                    done.add(key)
                    del running[key]
            for job in pending_jobs(protocol, out, starts, methods):
                if len(running) >= max(1, workers):
                    break
                if job.key not in running and job.key not in done:
                    print(f"[long] start {job.key}", flush=True)
                    running[job.key] = pool.apply_async(_run_job, ((job, protocol, out),))
            if not running:
                return log
            time.sleep(2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from .long_report import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Output folder (default benchmarks/results/lm_long, or lm_long-smoke with --smoke). "
        "Models go to <out>/<start>/models, which git ignores.",
    )
    parser.add_argument("--workers", type=int, default=2, help="Jobs at a time, one torch thread each.")
    parser.add_argument("--starts", nargs="+", choices=LongProtocol().starts, default=list(LongProtocol().starts))
    protocol = LongProtocol()
    methods = [*protocol.core_methods, *protocol.optional_methods]
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=methods,
        default=methods,
        help="Methods to run (optional ones run after every core run).",
    )
    parser.add_argument("--report-only", action="store_true", help="Only tables and figures from finished runs.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    if args.smoke:
        protocol = protocol.scaled_down()
    out = args.out or RESULTS_DIR / ("lm_long-smoke" if args.smoke else "lm_long")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not args.report_only:
        run_all(protocol, out, args.starts, args.methods, args.workers)
    return report(protocol, out, args.starts, args.methods, time.perf_counter() - started)


if __name__ == "__main__":
    main()
