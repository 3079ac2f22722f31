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

import os
from pathlib import Path
from typing import Any

from benchmarks._common import json_exists, read_json
from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser, write_json

from .config import ExactProtocol, LMConfig, run_eval_seed
from .evaluation import evaluate_tracked
from .exact import pass_at_k, problem_probabilities
from .exact_report import report
from .plans import Run, exact_runs, run_path
from .run import BestWeights, build_trainer, load_summary, train_timed, training_curves
from .starts import STARTS_DIR, WEIGHTS, build_starts, checked_start, sha256_of
from .task import StrictExactMatch, make_splits


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


def trainer_from_start(cfg: LMConfig, job: Run, start_dir: Path, out: Path, train_buckets: tuple[int, ...] | None):
    """The trainer of one run from a committed start: the strict exact-match grader, no activation checkpointing
    (the tiny model needs no memory saving), its checkpoints under ``out/<start>/models/<name>``."""
    return build_trainer(
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


def run_identity(job: Run, start_dir: Path, eval_seed: int) -> dict[str, Any]:
    """The head of a run's result: its start (and the SHA-256 of its weights), method, rate, seed and evaluation
    seed."""
    return {
        "start": job.start,
        "start_sha256": sha256_of(start_dir / WEIGHTS),
        "method": job.method,
        "lr": job.lr,
        "seed": job.seed,
        "eval_seed": eval_seed,
    }


def run_exact(protocol: ExactProtocol, job: Run, start_dir: Path, out: Path) -> dict[str, Any]:
    """One run from ``start_dir`` (the baseline study's at its own rates, too); writes ``out/<start>/runs/<name>.json``.

    Every ``eval_every`` generation batches: the exact validation probabilities, the exact selection score and the
    sampled entropy (the run's own seed, :func:`run_eval_seed`, plus the batch); the weights with the best score so
    far are kept in memory. At the end: the exact test probabilities of the final weights (the primary result) and of
    the best validation checkpoint where that is earlier, and the sampled test entropy."""
    from transformers import TrainerCallback

    cfg = protocol.lm
    eval_seed = run_eval_seed(job.start, job.method, job.seed)
    trainer = trainer_from_start(cfg, job, start_dir, out, protocol.train_buckets(job.start))
    tokenizer = trainer.processing_class
    splits = make_splits(cfg)
    tracked: list[dict[str, Any]] = []
    best = BestWeights()
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
            best.offer(score, batch, model)
            print(
                f"[exact] {job.key} batch {batch}: val criterion {score:.4f}, entropy {entropy['all']:.3f}",
                flush=True,
            )

    trainer.add_callback(TrackValidation())
    seconds = train_timed(trainer)
    model = trainer.model
    model.eval()
    final_batch = trainer.state.global_step // cfg.updates_per_generation
    result = {
        **run_identity(job, start_dir, eval_seed),
        "train_buckets": list(protocol.train_buckets(job.start) or []) or None,
        "train_seconds": seconds,
        "load_average": load_summary(loads),
        "curves": training_curves(trainer, cfg, job.seed),
        "batch_signals": getattr(trainer, "batch_signal_history", []),
        "tracked": tracked,
        "test_p": exact_probs(model, tokenizer, splits.test, cfg),
        "test_entropy": sampled_entropy(
            model, tokenizer, splits.test, cfg, protocol.entropy_samples, eval_seed + final_batch + 1
        ),
        "best_val_generation_batch": best.generation_batch,
    }
    if best.earlier_than(final_batch):
        model.load_state_dict(best.state)
        result["best_val_test_p"] = exact_probs(model, tokenizer, splits.test, cfg)
    write_json(run_path(out, job), result)
    print(f"[exact] {job.key}: {seconds / 60:.1f} min", flush=True)
    return result


def start_dirs(protocol: ExactProtocol, out: Path, smoke: bool) -> dict[str, Path]:
    """The committed starts (checked against their SHA-256); the smoke size builds its own under ``out``."""
    if smoke:
        build_starts(protocol, out / "starts")
        return {s: checked_start(out / "starts" / s) for s in protocol.starts}
    return {s: checked_start(STARTS_DIR / s) for s in protocol.starts}


def evaluated_starts(protocol: ExactProtocol, folder: Path, smoke: bool) -> dict[str, Path]:
    """The starts of :func:`start_dirs`, each evaluated (:func:`evaluate_start`, cached under ``folder``)."""
    dirs = start_dirs(protocol, folder, smoke)
    for start, start_dir in dirs.items():
        evaluate_start(protocol, start, start_dir, folder)
    return dirs


def jobs(protocol: ExactProtocol, out: Path, dirs: dict[str, Path]) -> list[Job]:
    """The pipeline's jobs, in :func:`~.plans.exact_runs` order."""
    return [
        Job(run.key, run_path(out, run), run_exact, (protocol, run, dirs[run.start], out))
        for run in exact_runs(protocol)
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_study_args(study_parser(__doc__, "lm_exact"), argv)
    protocol = ExactProtocol().scaled_down() if args.smoke else ExactProtocol()
    if not args.report_only:
        dirs = evaluated_starts(protocol, args.out, args.smoke)
        run_jobs(lambda: jobs(protocol, args.out, dirs), args.workers, "exact")
    return report(protocol, args.out)


if __name__ == "__main__":
    main()
