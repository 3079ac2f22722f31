"""The short protocol (``python -m benchmarks.lm_study``): GRPO, GSPO, RiskPO, RiskPO with the authors' DAPO
advantage and risk-seeking on a task with a hard tail, each method tuned fairly, at identical compute (CPU, about an
hour on 2 busy cores).

One command runs everything, resumable (every run is cached as JSON; a rerun skips finished runs)::

    python -m benchmarks.lm_study                 # SFT start, lr grid, selection, test seeds, report
    python -m benchmarks.lm_study --smoke         # trivial size for the test suite; numbers mean nothing
    python -m benchmarks.lm_study --report-only   # tables and figures from whatever runs have finished

The task (:mod:`.task`): ``a+b=`` with both operands of ``d`` digits, ``d`` in {2, 3, 4} (the difficulty buckets),
reward 1 iff the completion is exactly the sum. A tiny Qwen2 (character tokenizer, built locally) is fine-tuned on
the task with TRL's ``SFTTrainer`` until the easy bucket is mostly solved while the hardest is not (the stopping rule
is in :class:`LMConfig`); that one SFT model is the start of every RL run.

The protocol, fixed in :class:`LMConfig` before any RL run (only the SFT budget was calibrated before, on the SFT
start alone, and is recorded in ``sft_summary.json``):

- identical compute for every method: the same generation batches (``prompts_per_generation`` prompts x
  ``num_generations`` completions, temperature 0.8), split into 4 mini-batches, one Adam update each (the paper's
  4 updates per generation batch), the same number of generation batches, the same seeds;
- methods: ``grpo`` = TRL's ``GRPOTrainer`` with its own defaults for the loss (token-level ratio,
  ``loss_type="dapo"``, group-scaled advantage); ``gspo`` = ``GRPOTrainer`` with
  ``importance_sampling_level="sequence"`` and ``loss_type="grpo"``, the loss RiskPO uses, so GSPO vs RiskPO
  isolates the advantage; ``riskpo`` = ``RiskPOTrainer`` with the paper's defaults; ``riskpo_authors`` = the
  authors' DAPO-script advantage; ``risk_seeking`` = ``risk_profile="risk_seeking"``;
- fair tuning: every method trains at every learning rate of ``learning_rates`` with ``grid_seed``; the learning rate
  is chosen per method on the validation split by ``SELECTION_CRITERION`` (mean of validation Pass@1 and Pass@16);
  the chosen learning rate is then run with every seed of ``test_seeds`` (the grid run is reused for ``grid_seed``)
  and reported on the test split as mean +- std;
- measured along training: mean reward, token entropy (TRL's), the lower-tail RVaR of bundle scores (bundles of 5
  drawn identically for every method) and the covariance (and correlation) between a completion's length-normalised
  log-probability and its advantage within each prompt's group; at the end Pass@k (k = 1..16) per difficulty bucket.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import datasets
import torch

from benchmarks._common import RESULTS_DIR

from .config import METHODS, LMConfig
from .diagnostics import gradient_diagnostics
from .run import run_name, run_rl, select_lrs
from .sft import run_sft
from .short_report import report


def _worker(job: tuple[str, float, int, LMConfig, Path]) -> str:
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    method, lr, seed, cfg, out_dir = job
    try:
        run_rl(method, lr, seed, cfg, out_dir)
        return f"{run_name(method, lr, seed)}: ok"
    except Exception as error:  # one failed run must not take the others down; it is reported and rerun next time
        import traceback

        traceback.print_exc()
        return f"{run_name(method, lr, seed)}: FAILED {type(error).__name__}: {error}"


def run_jobs(jobs: list[tuple], workers: int) -> list[str]:
    if workers <= 1 or len(jobs) <= 1:
        return [_worker(job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
        return list(pool.imap_unordered(_worker, jobs))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Output folder (default benchmarks/results/lm, or lm-smoke with --smoke). Models go to "
        "<out>/models, which git ignores.",
    )
    parser.add_argument("--workers", type=int, default=2, help="Parallel RL runs, one torch thread each.")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--report-only", action="store_true", help="Only tables and figures from finished runs.")
    parser.add_argument(
        "--extra-lrs",
        nargs="+",
        type=float,
        default=[],
        help="Add learning rates to the grid (a post hoc extension; use a separate --out so the "
        "pre-registered selection stays as it was).",
    )
    parser.add_argument(
        "--skip-diagnostics",
        action="store_true",
        help="Do not measure the gradient noise of each advantage at the SFT start.",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    cfg = LMConfig().scaled_down() if args.smoke else LMConfig()
    if args.extra_lrs:
        cfg = replace(cfg, learning_rates=tuple(sorted(set(cfg.learning_rates) | set(args.extra_lrs))))
    out = args.out or RESULTS_DIR / ("lm-smoke" if args.smoke else "lm")
    out.mkdir(parents=True, exist_ok=True)
    methods = list(args.methods)
    start = time.perf_counter()
    if not args.report_only:
        run_sft(cfg, out)
        grid_jobs = [(m, lr, cfg.grid_seed, cfg, out) for lr in cfg.learning_rates for m in methods]
        for line in run_jobs(grid_jobs, args.workers):
            print("[grid]", line, flush=True)
        chosen = select_lrs(cfg, out, methods)
        print(f"[select] {chosen}", flush=True)
        seed_jobs = [(m, lr, s, cfg, out) for s in cfg.test_seeds for m, lr in chosen.items()]
        for line in run_jobs(seed_jobs, args.workers):
            print("[seeds]", line, flush=True)
        if not args.skip_diagnostics:
            gradient_diagnostics(
                cfg,
                out,
                [m for m in methods if m != "gspo"],  # GSPO's advantage is GRPO's
                num_batches=3 if args.smoke else 32,
            )
    return report(cfg, out, methods, time.perf_counter() - start)


if __name__ == "__main__":
    main()
