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

import os
import platform
from pathlib import Path
from typing import Any

import torch

from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser

from .config import run_eval_seed
from .exact_protocol import (
    evaluated_starts,
    exact_probs,
    run_identity,
    sampled_entropy,
    selection_score,
    trainer_from_start,
)
from .frontier_config import FrontierProtocol
from .frontier_report import report
from .frontier_store import rounded, write_run
from .plans import Run, frontier_path, frontier_runs
from .run import load_summary, train_timed
from .task import make_splits


def run_frontier(protocol: FrontierProtocol, job: Run, start_dir: Path, out: Path) -> dict[str, Any]:
    """One run from ``start_dir``; at every checkpoint of ``protocol.checkpoints()``: the exact validation and test
    probabilities, the exact validation criterion and the sampled validation entropy (the run's own seed plus the
    batch). At the end: the sampled test entropy. Cached with :func:`~.frontier_store.write_run`."""
    path = frontier_path(out, job)
    import transformers
    import trl
    from transformers import TrainerCallback

    exact, cfg = protocol.exact, protocol.exact.lm
    eval_seed = run_eval_seed(job.start, job.method, job.seed)
    train_buckets = exact.train_buckets(job.start)
    trainer = trainer_from_start(cfg, job, start_dir, out, train_buckets)
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
    seconds = train_timed(trainer)
    model = trainer.model
    model.eval()
    final_batch = trainer.state.global_step // cfg.updates_per_generation
    result = {
        **run_identity(job, start_dir, eval_seed),
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
        "load_average": load_summary(loads),
        "checkpoints": entries,
        "test_entropy": sampled_entropy(
            model, tokenizer, splits.test, cfg, exact.entropy_samples, eval_seed + final_batch + 1
        ),
        "reward": [round(sum(b) / len(b), 4) for b in trainer.reward_funcs[0].batches],
    }
    write_run(path, result)
    print(f"[frontier] {job.key}: {seconds / 60:.1f} min", flush=True)
    return result


def jobs(protocol: FrontierProtocol, out: Path, reference: Path, dirs: dict[str, Path]) -> list[Job]:
    """The pipeline's jobs for every run :func:`~.plans.frontier_runs` names now."""
    return [
        Job(run.key, frontier_path(out, run), run_frontier, (protocol, run, dirs[run.start], out))
        for run in frontier_runs(protocol, out, reference)
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_study_args(study_parser(__doc__, "lm_frontier", reference="lm_exact"), argv)
    protocol = FrontierProtocol().scaled_down() if args.smoke else FrontierProtocol()
    out, reference = args.out, args.reference
    if not args.report_only:
        dirs = evaluated_starts(protocol.exact, reference, args.smoke)
        run_jobs(lambda: jobs(protocol, out, reference, dirs), args.workers, "frontier")
    return report(protocol, out, reference)


if __name__ == "__main__":
    main()
