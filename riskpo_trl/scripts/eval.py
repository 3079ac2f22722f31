"""``riskpo-eval``: sample completions and report Pass@k / Avg@k per benchmark (thin over riskpo_trl.evaluation).

Example::

    riskpo-eval --model Qwen/Qwen2.5-Math-1.5B --benchmarks aime24 amc math500 --num_samples 32 --ks 1 8 32 \\
        --output_dir eval/qwen-1.5b

writes ``samples.jsonl``, ``results.json`` and ``results.md`` (a table like the paper's Table 1) to ``output_dir``
as the run goes, and prints the table at the end. Code (``livecodebench_v5``) and geometry (``geometry3k_test``)
benchmarks are graded by their own scorers. Offline, name local files in a benchmark's Hub schema:
``--benchmarks math500=path/to/math500.jsonl``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .console import pop_debug_flag, usage_errors
from ..evaluation.config import EvalConfig
from .arguments import parse_dataclass


def main(argv: Sequence[str] | None = None) -> dict:
    config = parse_dataclass(EvalConfig, argv, prog="riskpo-eval",
                             description="Sample completions and report Pass@k / Avg@k per benchmark.")
    from ..evaluation.evaluator import evaluate
    from ..evaluation.records import TABLE_FILE

    results = evaluate(config)
    with open(f"{config.output_dir}/{TABLE_FILE}") as f:
        print(f.read())
    return results


def cli(argv: Sequence[str] | None = None) -> None:
    """A bad option, file or benchmark is one ``riskpo-eval: error:`` line and exit code 2 (``--debug``: traceback)."""
    argv, debug = pop_debug_flag(sys.argv[1:] if argv is None else argv)
    with usage_errors("riskpo-eval", debug, (ValueError, OSError, ImportError, RuntimeError)):
        main(argv)


if __name__ == "__main__":
    cli()
