"""``riskpo-eval``: sample completions and report Pass@k / Avg@k per benchmark (thin over riskpo_trl.evaluation).

Example::

    riskpo-eval --model Qwen/Qwen2.5-Math-1.5B --benchmarks aime24 amc math500 --num_samples 32 --ks 1 8 32 \\
        --output_dir eval/qwen-1.5b

writes ``samples.jsonl``, ``results.json`` and ``results.md`` (a table like the paper's Table 1) to ``output_dir``
as the run goes, and prints the table at the end. Code (``livecodebench_v5``) and geometry (``geometry3k_test``)
benchmarks are graded by their own scorers. Offline, name local files in a benchmark's Hub schema:
``--benchmarks math500=path/to/math500.jsonl`` (its results are labelled ``math500=math500.jsonl``).
An ``output_dir`` that already holds samples is refused unless ``--resume true`` (keep them, sample the rest) or
``--overwrite true`` (start over) says what to do with them. A local PEFT adapter directory given as ``--model`` is
evaluated on the base model its ``adapter_config.json`` names.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..evaluation.config import EvalConfig
from .arguments import parse_dataclass
from .console import pop_debug_flag, usage_errors


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for required options and where the help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.required or "Default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def main(argv: Sequence[str] | None = None) -> dict:
    config = parse_dataclass(
        EvalConfig,
        argv,
        prog="riskpo-eval",
        description="Sample completions and report Pass@k / Avg@k per benchmark.",
        formatter_class=DefaultsHelpFormatter,
    )
    from ..hub_access import use_offline_mode_if_unreachable
    from ..job.checks import check_model_available

    # At once (before torch loads), not after the Hub's retries: a local path that does not exist (the same check as
    # riskpo-train's); and when something is to come from the Hub, whether it answers, asked once: if not, the
    # libraries go offline, so a benchmark or model missing from the local caches fails at once.
    models = [config.model, *([config.adapter] if config.adapter is not None else [])]
    if any("=" not in entry for entry in config.benchmarks) or not all(os.path.exists(m) for m in models):
        use_offline_mode_if_unreachable()
    check_model_available(config.model, config.model_source)
    if config.adapter is not None:
        check_model_available(config.adapter, "adapter")
    check_row_columns(config)
    from ..tiny_model import warn_if_tiny_random_model

    warn_if_tiny_random_model(config.model, config.model_source)
    from ..evaluation.evaluator import evaluate
    from ..evaluation.records import TABLE_FILE
    from .cpu_threads import use_default_cpu_threads

    use_default_cpu_threads()

    results = evaluate(config)
    with open(f"{config.output_dir}/{TABLE_FILE}") as f:
        print(f.read())
    return results


def check_row_columns(config: EvalConfig) -> None:
    """The prompt and answer columns named for ``dataset_files`` exist, read without `datasets` (before torch loads),
    with the message the rows' reader gives later."""
    from ..data.columns import check_columns_exist
    from ..data.local_files import peek_columns

    chosen = {"answer_column": config.answer_column, "prompt_column": config.prompt_column}
    for path in config.dataset_files:
        found = peek_columns([path]) if os.path.isfile(path) else None
        if found is not None:
            check_columns_exist(found[0], chosen, str(path))


def cli(argv: Sequence[str] | None = None) -> None:
    """A bad option, file or benchmark is one ``riskpo-eval: error:`` line and exit code 2 (``--debug``: traceback)."""
    argv, debug = pop_debug_flag(sys.argv[1:] if argv is None else argv)
    with usage_errors("riskpo-eval", debug, (ValueError, OSError, ImportError, RuntimeError)):
        main(argv)


if __name__ == "__main__":
    cli()
