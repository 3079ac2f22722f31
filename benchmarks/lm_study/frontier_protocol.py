"""The frontier study: RiskPO's variants against GRPO tuned the same way, at matched exact test Pass@1.

One command, resumable (each run is cached the moment it finishes; a rerun skips what is cached, and a killed run
simply starts again)::

    python -m benchmarks.lm_study.frontier_protocol                 # every run, then the report
    python -m benchmarks.lm_study.frontier_protocol --smoke         # trivial sizes for the test suite
    python -m benchmarks.lm_study.frontier_protocol --report-only   # the report from whatever runs are cached

Everything is fixed in :mod:`benchmarks.lm_study.frontier_config` before the first run. Runs go one at a time (``--workers N``: N
at once), each in a fresh process with one torch thread, in this order, so that any finished prefix is balanced: the learning-rate
grid of the paper's and the authors' advantage (seed 0, both starts); then seed 5 of every arm from both starts, then
seed 6, and so on. The starts, their evaluations (checkpoint 0) and the reused grid runs are the exact protocol's
(``--reference``); at the smoke size everything is built and run here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch

from benchmarks._common import RESULTS_DIR, json_exists, read_json

from .config import run_eval_seed
from .exact_protocol import evaluate_start, exact_probs, sampled_entropy, selection_score, start_dirs
from .frontier_config import FrontierProtocol
from .frontier_store import read_run, rounded, run_file, write_run
from .run import build_trainer, run_name
from .starts import WEIGHTS, sha256_of
from .task import StrictExactMatch, make_splits


@dataclass(frozen=True)
class Job:
    """One run of this study: ``method`` from ``start`` at ``lr`` with ``seed``."""

    start: str
    method: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.method, self.lr, self.seed)

    @property
    def key(self) -> str:
        return f"{self.start}/{self.name}"

    def path(self, out: Path) -> Path:
        return run_file(out, self.start, self.name)


def reused_grid_path(protocol: FrontierProtocol, reference: Path, start: str, method: str, lr: float) -> Path | None:
    """The exact protocol's cached seed-0 run of ``method`` at ``lr``, when that is the exact protocol's rate and the
    file exists (then the grid reuses it); else None."""
    exact = protocol.exact
    if method not in exact.methods or exact.lr(start, method) != lr or protocol.grid_seed not in exact.seeds:
        return None
    path = reference / start / "runs" / f"{run_name(method, lr, protocol.grid_seed)}.json"
    return path if json_exists(path) else None


def grid_score(
    protocol: FrontierProtocol, out: Path, reference: Path, start: str, method: str, lr: float
) -> float | None:
    """The final exact validation criterion of the grid's seed-0 run (None: not finished)."""
    reused = reused_grid_path(protocol, reference, start, method, lr)
    if reused is not None:
        return read_json(reused)["tracked"][-1]["score"]
    run = read_run(Job(start, method, lr, protocol.grid_seed).path(out))
    return run["checkpoints"][-1]["val_criterion"] if run else None


def chosen_lr(protocol: FrontierProtocol, out: Path, reference: Path, start: str, method: str) -> float | None:
    """``FRONTIER_RATE_RULE``: the grid rate with the best final validation criterion (ties: the smaller), once
    the grid is complete."""
    scores = {lr: grid_score(protocol, out, reference, start, method, lr) for lr in protocol.grid_rates}
    if any(score is None for score in scores.values()):
        return None
    return max(sorted(scores), key=lambda lr: scores[lr])  # max keeps the first (smallest) on ties


def arms(protocol: FrontierProtocol, out: Path, reference: Path, start: str) -> list[tuple[str, float]]:
    """Every (method, rate) compared from ``start`` that can be named now (a ruled method once its grid is done)."""
    named = [(method, lr) for method, rates in protocol.fixed_arms for lr in rates]
    for method in protocol.ruled_methods:
        lr = chosen_lr(protocol, out, reference, start, method)
        if lr is not None:
            named.append((method, lr))
    return named


def planned_jobs(protocol: FrontierProtocol, out: Path, reference: Path) -> list[Job]:
    """Every run the study needs that can be named now, in the order they run: the grid runs not reused; then seed
    by seed, every arm from every start."""
    starts = protocol.exact.starts
    jobs = [
        Job(start, method, lr, protocol.grid_seed)
        for start in starts
        for method in protocol.ruled_methods
        for lr in protocol.grid_rates
        if reused_grid_path(protocol, reference, start, method, lr) is None
    ]
    named = {start: arms(protocol, out, reference, start) for start in starts}
    jobs += [
        Job(start, method, lr, seed) for seed in protocol.seeds for start in starts for method, lr in named[start]
    ]
    return list(dict.fromkeys(jobs))


def pending_jobs(protocol: FrontierProtocol, out: Path, reference: Path) -> list[Job]:
    return [j for j in planned_jobs(protocol, out, reference) if not j.path(out).exists()]


def run_frontier(protocol: FrontierProtocol, job: Job, start_dir: Path, out: Path) -> dict[str, Any]:
    """One run from ``start_dir``; at every checkpoint of ``protocol.checkpoints()``: the exact validation and test
    probabilities, the exact validation criterion and the sampled validation entropy (the run's own seed plus the
    batch). At the end: the sampled test entropy. Cached with :func:`~.frontier_store.write_run`."""
    path = job.path(out)
    cached = read_run(path)
    if cached is not None:
        return cached
    import transformers
    import trl
    from transformers import TrainerCallback

    exact, cfg = protocol.exact, protocol.exact.lm
    eval_seed = run_eval_seed(job.start, job.method, job.seed)
    train_buckets = exact.train_buckets(job.start)
    trainer = build_trainer(
        job.method,
        job.lr,
        job.seed,
        cfg,
        start_dir,
        out / job.start / "models" / job.name,
        train_buckets=train_buckets,
        grader_for=StrictExactMatch,
        gradient_checkpointing=False,
    )
    tokenizer = trainer.processing_class
    splits = make_splits(cfg)
    checkpoints = set(protocol.checkpoints())
    digits = protocol.stored_digits
    entries: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]  # the cores are shared: each run records its load

    class TrackCheckpoints(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            batch, rest = divmod(state.global_step, cfg.updates_per_generation)
            if rest or batch not in checkpoints:
                return
            val_p = exact_probs(model, tokenizer, splits.val, cfg)
            test_p = exact_probs(model, tokenizer, splits.test, cfg)
            entropy = sampled_entropy(model, tokenizer, splits.val, cfg, exact.entropy_samples, eval_seed + batch)
            model.train()
            entries.append(
                {
                    "generation_batch": batch,
                    "val_criterion": selection_score(val_p),
                    "val_entropy": entropy,
                    "val_p": rounded(val_p, digits),
                    "test_p": rounded(test_p, digits),
                }
            )
            loads.append(os.getloadavg()[0])
            print(f"[frontier] {job.key} batch {batch}: val criterion {entries[-1]['val_criterion']:.4f}", flush=True)

    trainer.add_callback(TrackCheckpoints())
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    model = trainer.model
    model.eval()
    final_batch = trainer.state.global_step // cfg.updates_per_generation
    result = {
        "start": job.start,
        "start_sha256": sha256_of(start_dir / WEIGHTS),
        "method": job.method,
        "lr": job.lr,
        "seed": job.seed,
        "eval_seed": eval_seed,
        "settings": {
            "generation_batches": cfg.generation_batches,
            "updates_per_generation": cfg.updates_per_generation,
            "prompts_per_generation": cfg.prompts_per_generation,
            "num_generations": cfg.num_generations,
            "bundle_size": cfg.bundle_size,
            "temperature": cfg.temperature,
            "max_completion_length": cfg.max_completion_length,
            "train_buckets": list(train_buckets or []) or None,
            "checkpoints": sorted(checkpoints),
            "entropy_samples": exact.entropy_samples,
            "stored_digits": digits,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "train_seconds": seconds,
        "load_average": {"mean": sum(loads) / len(loads), "max": max(loads), "samples": len(loads)},
        "checkpoints": entries,
        "test_entropy": sampled_entropy(
            model, tokenizer, splits.test, cfg, exact.entropy_samples, eval_seed + final_batch + 1
        ),
        "reward": [round(sum(b) / len(b), 4) for b in trainer.reward_funcs[0].batches],
    }
    write_run(path, result)
    print(f"[frontier] {job.key}: {seconds / 60:.1f} min", flush=True)
    return result


def run_one(args) -> str:
    """One run in a worker process (one torch thread); a failure is reported, never raised."""
    job, protocol, start_dir, out = args
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    try:
        started = time.perf_counter()
        run_frontier(protocol, job, start_dir, out)
        return f"{job.key}: ok ({(time.perf_counter() - started) / 60:.1f} min)"
    except Exception as error:  # one failed run must not stop the others; it is rerun next time
        import traceback

        traceback.print_exc()
        return f"{job.key}: FAILED {type(error).__name__}: {error}"


def run_all(protocol: FrontierProtocol, out: Path, reference: Path, dirs: dict[str, Path], workers: int) -> list[str]:
    """Every uncached run in :func:`planned_jobs` order, up to ``workers`` at once, each in a fresh process
    (``workers=0``: one at a time in this process). The plan is read again whenever a run ends, since the grid decides
    the ruled methods' rates. A failed run is not retried here. Concurrency changes no result: every run is seeded
    and uses one torch thread; only its recorded seconds and load differ."""
    for start, start_dir in dirs.items():
        evaluate_start(protocol.exact, start, start_dir, reference)
    log: list[str] = []
    failed: set[Path] = set()

    def next_jobs(busy: set[Path]) -> list[Job]:
        return [j for j in pending_jobs(protocol, out, reference) if j.path(out) not in failed | busy]

    def finished(job: Job, line: str) -> None:
        print("[frontier]", line, flush=True)
        log.append(line)
        if not job.path(out).exists():
            failed.add(job.path(out))

    if workers == 0:
        while jobs := next_jobs(set()):
            print(f"[frontier] {len(jobs)} runs to go; start {jobs[0].key}", flush=True)
            finished(jobs[0], run_one((jobs[0], protocol, dirs[jobs[0].start], out)))
        return log
    context = multiprocessing.get_context("spawn")
    running: dict[Path, tuple[Job, Any]] = {}
    with context.Pool(workers, maxtasksperchild=1) as pool:
        while True:
            jobs = next_jobs(set(running))
            to_go = len(jobs) + len(running)
            for job in jobs[: workers - len(running)]:
                print(f"[frontier] {to_go} runs to go; start {job.key}", flush=True)
                running[job.path(out)] = (job, pool.apply_async(run_one, ((job, protocol, dirs[job.start], out),)))
            if not running:
                return log
            while not any(result.ready() for _, result in running.values()):
                time.sleep(2)
            for path, (job, result) in list(running.items()):
                if result.ready():
                    del running[path]
                    finished(job, result.get())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from .frontier_report import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Output folder (default benchmarks/results/lm_frontier, or lm_frontier-smoke with --smoke).",
    )
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="The exact protocol's folder: its starts' evaluations and reused grid runs (default "
        "benchmarks/results/lm_exact; with --smoke, the output folder).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="How many runs at once, each in a fresh process with one torch thread; 0: one at a time in this process.",
    )
    parser.add_argument("--report-only", action="store_true", help="Only the report, from the cached runs.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    protocol = FrontierProtocol().scaled_down() if args.smoke else FrontierProtocol()
    out = args.out or RESULTS_DIR / ("lm_frontier-smoke" if args.smoke else "lm_frontier")
    reference = args.reference or (out if args.smoke else RESULTS_DIR / "lm_exact")
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(protocol, out, reference, start_dirs(protocol.exact, reference, args.smoke), args.workers)
    return report(protocol, out, reference)


if __name__ == "__main__":
    main()
