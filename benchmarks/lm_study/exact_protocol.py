"""The exact-evaluation protocol: the long protocol's decisive comparisons re-run from committed starts, with each
test problem's success probability computed exactly and every comparison given a problem-level bootstrap CI.

One command, resumable (every start evaluation and run is cached as JSON the moment it finishes; a rerun skips what
is cached, and a killed run simply starts again)::

    python -m benchmarks.lm_study.exact_protocol                 # every run, then the report
    python -m benchmarks.lm_study.exact_protocol --smoke         # trivial sizes for the test suite
    python -m benchmarks.lm_study.exact_protocol --report-only   # the report from whatever runs are cached

Everything is fixed in :class:`~benchmarks.lm_study.config.ExactProtocol` and
:data:`~benchmarks.lm_study.config.EXACT_VERDICT_RULE` before the first run. Runs go one at a time by default, in an
order that completes paired comparisons first: from the moderate start, every method with seed 0, then every method
with seed 1, ...; then the same from the low start.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch

from benchmarks._common import RESULTS_DIR, json_exists, read_json

from .config import ExactProtocol, LMConfig, run_eval_seed
from .evaluation import evaluate_tracked
from .exact import pass_at_k, problem_probabilities
from .run import build_trainer, run_name, training_curves, write_json
from .starts import STARTS_DIR, WEIGHTS, build_starts, checked_start, sha256_of
from .task import StrictExactMatch, make_splits


@dataclass(frozen=True)
class Job:
    start: str
    method: str
    seed: int

    def name(self, protocol: ExactProtocol) -> str:
        return run_name(self.method, protocol.lr(self.start, self.method), self.seed)

    def key(self, protocol: ExactProtocol) -> str:
        return f"{self.start}/{self.name(protocol)}"


def job_order(protocol: ExactProtocol) -> list[Job]:
    """Per start, seed by seed, every method: whatever has finished forms paired comparisons."""
    return [
        Job(start, method, seed) for start in protocol.starts for seed in protocol.seeds for method in protocol.methods
    ]


def run_path(protocol: ExactProtocol, out: Path, job: Job) -> Path:
    return out / job.start / "runs" / f"{job.name(protocol)}.json"


def exact_probs(model, tokenizer, problems, cfg: LMConfig) -> dict[str, list[float]]:
    return problem_probabilities(
        model, tokenizer, problems, temperature=cfg.temperature, max_completion_length=cfg.max_completion_length
    )


def sampled_entropy(model, tokenizer, problems, cfg: LMConfig, samples: int, seed: int) -> dict[str, float]:
    """The sampling policy's token entropy per bucket and overall (see ``evaluate_tracked``), from ``samples``
    completions per problem drawn with ``seed``: the one sampled quantity of the evaluation."""
    result = evaluate_tracked(
        model,
        tokenizer,
        problems,
        num_samples=samples,
        ks=(1,),
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_completion_length,
        seed=seed,
    )
    return {bucket: r["entropy"] for bucket, r in result.items()}


def selection_score(probs: dict[str, list[float]]) -> float:
    """``LONG_SELECTION_CRITERION`` computed exactly: mean of Pass@1 and Pass@16 over every problem of the split."""
    p = [x for bucket in probs.values() for x in bucket]
    return float((pass_at_k(p, 1).mean() + pass_at_k(p, 16).mean()) / 2)


def evaluate_start(protocol: ExactProtocol, start: str, start_dir: Path, out: Path) -> dict[str, Any]:
    """The start's exact validation and test probabilities and sampled entropies, cached in ``out/<start>``."""
    path = out / start / "start_eval.json"
    if json_exists(path):
        return read_json(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = protocol.lm
    model = AutoModelForCausalLM.from_pretrained(start_dir)
    tokenizer = AutoTokenizer.from_pretrained(start_dir)
    splits = make_splits(cfg)
    seed = run_eval_seed(start, "start", 0)
    result = {
        "start": start,
        "sha256": sha256_of(start_dir / WEIGHTS),
        "eval_seed": seed,
        "val_p": exact_probs(model, tokenizer, splits.val, cfg),
        "test_p": exact_probs(model, tokenizer, splits.test, cfg),
        "val_entropy": sampled_entropy(model, tokenizer, splits.val, cfg, protocol.entropy_samples, seed),
        "test_entropy": sampled_entropy(model, tokenizer, splits.test, cfg, protocol.entropy_samples, seed + 1),
    }
    write_json(path, result)
    return result


def run_exact(protocol: ExactProtocol, job: Job, start_dir: Path, out: Path) -> dict[str, Any]:
    """One run from ``start_dir``; writes ``out/<start>/runs/<name>.json``.

    Every ``eval_every`` generation batches: the exact validation probabilities, the exact selection score and the
    sampled entropy (the run's own seed, :func:`run_eval_seed`, plus the batch); the weights with the best score so
    far are kept in memory. At the end: the exact test probabilities of the final weights (the primary result) and of
    the best validation checkpoint where that is earlier, and the sampled test entropy."""
    path = run_path(protocol, out, job)
    if json_exists(path):
        return read_json(path)
    from transformers import TrainerCallback

    cfg = protocol.lm
    lr = protocol.lr(job.start, job.method)
    eval_seed = run_eval_seed(job.start, job.method, job.seed)
    trainer = build_trainer(
        job.method,
        lr,
        job.seed,
        cfg,
        start_dir,
        out / job.start / "models" / job.name(protocol),
        train_buckets=protocol.train_buckets(job.start),
        grader_for=StrictExactMatch,
        gradient_checkpointing=False,
    )
    tokenizer = trainer.processing_class
    splits = make_splits(cfg)
    tracked: list[dict[str, Any]] = []
    best: dict[str, Any] = {"score": -math.inf, "generation_batch": None, "state": None}
    steps_between = protocol.eval_every * cfg.updates_per_generation
    loads = [os.getloadavg()[0]]  # the cores are shared: each run records its load

    class TrackValidation(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % steps_between:
                return
            batch = state.global_step // cfg.updates_per_generation
            probs = exact_probs(model, tokenizer, splits.val, cfg)
            entropy = sampled_entropy(model, tokenizer, splits.val, cfg, protocol.entropy_samples, eval_seed + batch)
            model.train()
            score = selection_score(probs)
            tracked.append({"generation_batch": batch, "score": score, "val_p": probs, "entropy": entropy})
            loads.append(os.getloadavg()[0])
            if score > best["score"]:
                best.update(
                    score=score,
                    generation_batch=batch,
                    state={k: v.detach().clone() for k, v in model.state_dict().items()},
                )
            print(
                f"[exact] {job.key(protocol)} batch {batch}: val criterion {score:.4f}, entropy {entropy['all']:.3f}",
                flush=True,
            )

    trainer.add_callback(TrackValidation())
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
        "lr": lr,
        "seed": job.seed,
        "eval_seed": eval_seed,
        "train_buckets": list(protocol.train_buckets(job.start) or []) or None,
        "train_seconds": seconds,
        "load_average": {"mean": sum(loads) / len(loads), "max": max(loads), "samples": len(loads)},
        "curves": training_curves(trainer, cfg, job.seed),
        "batch_signals": getattr(trainer, "batch_signal_history", []),
        "tracked": tracked,
        "test_p": exact_probs(model, tokenizer, splits.test, cfg),
        "test_entropy": sampled_entropy(
            model, tokenizer, splits.test, cfg, protocol.entropy_samples, eval_seed + final_batch + 1
        ),
        "best_val_generation_batch": best["generation_batch"],
    }
    if best["state"] is not None and best["generation_batch"] != final_batch:
        model.load_state_dict(best["state"])
        result["best_val_test_p"] = exact_probs(model, tokenizer, splits.test, cfg)
    write_json(path, result)
    print(f"[exact] {job.key(protocol)}: {seconds / 60:.1f} min", flush=True)
    return result


def start_dirs(protocol: ExactProtocol, out: Path, smoke: bool) -> dict[str, Path]:
    """The committed starts (checked against their SHA-256); the smoke size builds its own under ``out``."""
    if smoke:
        build_starts(protocol, out / "starts")
        return {s: checked_start(out / "starts" / s) for s in protocol.starts}
    return {s: checked_start(STARTS_DIR / s) for s in protocol.starts}


def run_job(job: Job, protocol: ExactProtocol, start_dir: Path, out: Path) -> str:
    """One run in a worker process (one torch thread); a failure is reported, never raised."""
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    try:
        started = time.perf_counter()
        run_exact(protocol, job, start_dir, out)
        return f"{job.key(protocol)}: ok ({(time.perf_counter() - started) / 60:.1f} min)"
    except Exception as error:  # one failed run must not stop the others; it is rerun next time
        import traceback

        traceback.print_exc()
        return f"{job.key(protocol)}: FAILED {type(error).__name__}: {error}"


def _run_job(args) -> str:
    return run_job(*args)


def run_all(protocol: ExactProtocol, out: Path, dirs: dict[str, Path], workers: int) -> list[str]:
    """Every uncached run in :func:`job_order`, ``workers`` at a time in fresh processes (0: in this process)."""
    for start, start_dir in dirs.items():
        evaluate_start(protocol, start, start_dir, out)
    jobs = [j for j in job_order(protocol) if not json_exists(run_path(protocol, out, j))]
    print(f"[exact] {len(jobs)} runs to go", flush=True)
    if workers == 0:
        return [run_job(j, protocol, dirs[j.start], out) for j in jobs]
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(_run_job, ((j, protocol, dirs[j.start], out),)) for j in jobs]
        log = []
        for result in pending:
            log.append(result.get())
            print("[exact]", log[-1], flush=True)
    return log


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from .exact_report import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Output folder (default benchmarks/results/lm_exact, or lm_exact-smoke with --smoke).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Runs at a time, each in a fresh process with one torch thread (0: in this process).",
    )
    parser.add_argument("--report-only", action="store_true", help="Only the report, from the cached runs.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    protocol = ExactProtocol().scaled_down() if args.smoke else ExactProtocol()
    out = args.out or RESULTS_DIR / ("lm_exact-smoke" if args.smoke else "lm_exact")
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_all(protocol, out, start_dirs(protocol, out, args.smoke), args.workers)
    return report(protocol, out)


if __name__ == "__main__":
    main()
