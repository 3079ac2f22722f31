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

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import json_files
from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser

from .config import METHODS, LMConfig
from .diagnostics import gradient_diagnostics
from .run import run_name, run_rl, select_lrs
from .sft import run_sft
from .short_report import report


def rl_job(method: str, lr: float, seed: int, cfg: LMConfig, out: Path) -> Job:
    name = run_name(method, lr, seed)
    return Job(name, out / "runs" / f"{name}.json", run_rl, (method, lr, seed, cfg, out))


def jobs(cfg: LMConfig, out: Path, methods: list[str]) -> list[Job]:
    """The grid (seed ``grid_seed``, every rate, every method); then, for each method whose grid is complete, its
    chosen rate with every test seed."""
    grid = [rl_job(m, lr, cfg.grid_seed, cfg, out) for lr in cfg.learning_rates for m in methods]
    chosen = select_lrs(cfg, out, methods)
    return grid + [rl_job(m, lr, s, cfg, out) for s in cfg.test_seeds for m, lr in chosen.items()]


def cached_grid(cfg: LMConfig, out: Path) -> dict[str, list[float]]:
    """The learning rates of each method's cached grid runs (seed ``grid_seed``), methods in :data:`METHODS`'s
    order: what ``--report-only`` reports when no method is named."""
    grid: dict[str, set[float]] = {}
    for path in json_files(out / "runs"):
        name = path.name.removesuffix(".json")
        method, rest = name.rsplit("-lr", 1)
        lr, seed = rest.rsplit("-seed", 1)
        if int(seed) == cfg.grid_seed:
            grid.setdefault(method, set()).add(float(lr))
    return {m: sorted(grid[m]) for m in METHODS if m in grid}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = study_parser(__doc__, "lm", workers=2)
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=None,
        help="Methods to run (default: all); with --report-only, default: the methods the cache holds.",
    )
    parser.add_argument(
        "--extra-lrs",
        nargs="+",
        type=float,
        default=[],
        help="Add learning rates to the grid (a post hoc extension; use a separate --out so the "
        "pre-registered selection stays as it was). With --report-only, the rates the cache holds are added anyway.",
    )
    parser.add_argument(
        "--skip-diagnostics",
        action="store_true",
        help="Do not measure the gradient noise of each advantage at the SFT start.",
    )
    args = parse_study_args(parser, argv)
    cfg = LMConfig().scaled_down() if args.smoke else LMConfig()
    out = args.out
    extra_lrs = set(args.extra_lrs)
    if args.report_only:
        cached = cached_grid(cfg, out)
        never_run = sorted(set(args.methods or []) - set(cached))
        if never_run:
            parser.error(
                f"--methods {' '.join(never_run)}: no cached run in {out / 'runs'}; it holds "
                f"{' '.join(cached) or 'no run'}. Drop them, or run the study without --report-only."
            )
        extra_lrs |= {lr for lrs in cached.values() for lr in lrs}
        methods = list(args.methods or cached)
    else:
        methods = list(args.methods or METHODS)
    if extra_lrs:
        cfg = replace(cfg, learning_rates=tuple(sorted(set(cfg.learning_rates) | extra_lrs)))
    if not args.report_only:
        run_sft(cfg, out)
        run_jobs(lambda: jobs(cfg, out, methods), args.workers, "short")
        print(f"[select] {select_lrs(cfg, out, methods)}", flush=True)
        if not args.skip_diagnostics:
            gradient_diagnostics(
                cfg,
                out,
                [m for m in methods if m != "gspo"],  # GSPO's advantage is GRPO's
                num_batches=3 if args.smoke else 32,
            )
    return report(cfg, out, methods)


if __name__ == "__main__":
    main()
