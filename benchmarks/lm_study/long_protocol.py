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
grid, the selected learning rates' seeds, and the optional methods last. The plan is read again whenever a job ends,
so a job is scheduled as soon as what it needs is cached and both workers stay busy.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import json_exists
from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser

from .config import LongProtocol
from .long_report import report
from .plans import Run, run_path
from .run import evaluate_sft_start, run_long_rl, select_lrs
from .sft import continue_sft, run_sft


def sft_stage_config(protocol: LongProtocol):
    """The SFT stage of the short protocol exactly (its evaluation sizes drive its stopping rule)."""
    samples = min(16, protocol.lm.eval_samples)
    return replace(protocol.lm, eval_samples=samples, ks=tuple(k for k in range(1, samples + 1)))


def start_ready(protocol: LongProtocol, out: Path, start: str) -> bool:
    """The start's model is on disk and its summary and evaluation are cached (loose or packed)."""
    d = out / start
    return (
        json_exists(d / "sft_summary.json")
        and (d / "models" / "sft" / "config.json").exists()
        and json_exists(d / "start_eval.json")
    )


def seeds_of(protocol: LongProtocol, start: str) -> tuple[int, ...]:
    return protocol.lm.test_seeds if start == "low" else protocol.seeds_moderate


def build_start(protocol: LongProtocol, out: Path, start: str) -> None:
    """The start's SFT model (``low``: the short protocol's; ``moderate``: ``low`` continued) and its evaluation,
    written last (``start_eval.json``)."""
    if start == "low":
        run_sft(sft_stage_config(protocol), out / "low")
    else:
        continue_sft(
            sft_stage_config(protocol),
            out / "low" / "models" / "sft",
            out / start,
            bucket=protocol.moderate_bucket,
            target_pass1=protocol.moderate_target_pass1,
            check_every=protocol.moderate_check_every,
            check_samples=protocol.moderate_check_samples,
            max_steps=protocol.moderate_max_steps,
        )
    evaluate_sft_start(protocol.lm, out / start, protocol.track_samples)


def run_long(protocol: LongProtocol, out: Path, run: Run) -> None:
    run_long_rl(
        run.method,
        run.lr,
        run.seed,
        protocol.lm,
        out / run.start,
        eval_every=protocol.eval_every,
        track_samples=protocol.track_samples,
        train_buckets=protocol.moderate_rl_buckets if run.start == "moderate" else None,
    )


def jobs(protocol: LongProtocol, out: Path, starts: list[str], methods: list[str]) -> list[Job]:
    """Every job whose inputs are cached, in priority order: the starts not built (``moderate`` once ``low`` is);
    then per method group (core, optional) and start, the grid and the chosen rates' seeds."""
    cfg = protocol.lm
    planned = [
        Job(f"{start}/sft", out / start / "start_eval.json", build_start, (protocol, out, start))
        for start in starts
        if not start_ready(protocol, out, start)
        and not (start == "moderate" and not start_ready(protocol, out, "low"))
    ]
    core = [m for m in methods if m in protocol.core_methods]
    optional = [m for m in methods if m in protocol.optional_methods]
    for group in (core, optional):
        for start in starts:
            if not start_ready(protocol, out, start):
                continue
            runs = [Run(start, m, lr, cfg.grid_seed) for m in group for lr in cfg.learning_rates]
            chosen = select_lrs(cfg, out / start, group)
            runs += [Run(start, m, lr, s) for m, lr in chosen.items() for s in seeds_of(protocol, start)]
            planned += [Job(run.key, run_path(out, run), run_long, (protocol, out, run)) for run in runs]
    return planned


def main(argv: list[str] | None = None) -> dict[str, Any]:
    protocol = LongProtocol()
    methods = [*protocol.core_methods, *protocol.optional_methods]
    parser = study_parser(__doc__, "lm_long", workers=2)
    parser.add_argument("--starts", nargs="+", choices=protocol.starts, default=list(protocol.starts))
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=methods,
        default=methods,
        help="Methods to run (optional ones run after every core run).",
    )
    args = parse_study_args(parser, argv)
    if args.smoke:
        protocol = protocol.scaled_down()
    if not args.report_only:
        run_jobs(lambda: jobs(protocol, args.out, args.starts, args.methods), args.workers, "long")
    return report(protocol, args.out, args.starts, args.methods)


if __name__ == "__main__":
    main()
