"""``riskpo-plot``: figures from training runs and evaluation results (thin over riskpo_trl.evaluation.plots).

    riskpo-plot curves RiskPO=outputs/riskpo GRPO=outputs/grpo \\
        --eval RiskPO=eval/riskpo/results.json GRPO=eval/grpo/results.json --output figures/training_curves
    riskpo-plot logprob Base=eval/base/samples.jsonl RiskPO=eval/riskpo/samples.jsonl --output figures/logprob
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="riskpo-plot", description="Draw RiskPO/GRPO training and evaluation figures."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    curves = commands.add_parser("curves", help="Training curves of one or more runs, overlaid, plus Pass@k curves.")
    curves.add_argument("runs", nargs="+", help="[NAME=]output_dir or [NAME=]trainer_state.json, one per run.")
    curves.add_argument(
        "--eval",
        dest="eval_results",
        action="extend",
        nargs="+",
        default=[],
        metavar="[NAME=]results.json",
        help="results.json files of riskpo-eval, for the Pass@k-versus-k panel: several after one "
        "--eval, or --eval repeated (give the runs first: the files run to the next option). NAME "
        "is the run it belongs to (without it: the only run, or the run named like the file's "
        "folder), or a name of its own such as Base.",
    )
    curves.add_argument("--benchmark", default="average", help="Benchmark of the Pass@k panel (default: average).")
    curves.add_argument("--smoothing", type=float, default=0.0, help="EMA weight in [0, 1) (raw curve drawn faint).")
    curves.add_argument("--columns", type=int, default=3, help="Panels per row.")
    curves.add_argument("--title", default=None, help="Figure title.")
    curves.add_argument("--output", default="training_curves", help="Output path without suffix (.png and .pdf).")
    logprob = commands.add_parser("logprob", help="Completion log-prob against question reward rate.")
    logprob.add_argument("samples", nargs="+", help="[NAME=]samples.jsonl of `riskpo-eval --logprobs true`.")
    logprob.add_argument("--bins", type=int, default=5, help="Equal-width reward-rate bins over [0, 1].")
    logprob.add_argument("--output", default="logprob_diagnostic", help="Output path without suffix.")
    return parser


def main(argv: list[str] | None = None) -> list[Path]:
    args = build_parser().parse_args(argv)
    from ..evaluation.plots import load_run, plot_logprob_diagnostic, plot_training_curves

    if args.command == "curves":
        runs = [load_run(spec) for spec in args.runs]
        paths, notes = plot_training_curves(
            runs, args.output, args.eval_results, args.benchmark, args.smoothing, args.columns, args.title
        )
    else:
        notes = []
        paths = plot_logprob_diagnostic(args.samples, args.output, args.bins, notes)
    for note in notes:
        print(f"note: {note}")
    for path in paths:
        print(f"wrote {path}")
    return paths


def cli(argv: list[str] | None = None) -> None:
    """A bad option or file is one ``riskpo-plot: error:`` line and exit code 2 (``--debug``: traceback)."""
    from .console import pop_debug_flag, usage_errors

    argv, debug = pop_debug_flag(sys.argv[1:] if argv is None else argv)
    with usage_errors("riskpo-plot", debug, (ValueError, OSError)):
        main(argv)


if __name__ == "__main__":
    cli()
