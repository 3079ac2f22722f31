"""Column mappings: a user's prompt and gold-answer columns read under the names the trainer and the evaluator use.

``riskpo-train`` reads ``prompt`` and ``solution``; ``riskpo-eval`` reads the same, or ``problem`` and ``answer``.
``--prompt_column NAME`` and ``--answer_column NAME`` name other columns. A gold answer in GSM8K's form (a worked
solution ending ``#### 42``) is read as the text after its last ``####``, as the registered ``gsm8k`` adapter does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..registry import closest_name

logger = logging.getLogger(__name__)

GSM8K_MARK = "####"


def answer_text(value: Any) -> str:
    """A gold answer as text: lists (OlympiadBench) are joined, integral floats lose their ``.0``, ``$`` is dropped."""
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def gsm8k_answer(solution: str) -> str:
    """GSM8K: the final answer follows ``####`` at the end of the worked solution; thousands separators dropped."""
    _, separator, answer = solution.rpartition("####")
    return answer.strip().replace(",", "") if separator else ""


def gold_answer(value: Any) -> str:
    """A gold answer as text; GSM8K's worked solutions (``... #### 42``) give the text after the last ``####``."""
    text = answer_text(value)
    return gsm8k_answer(text) if GSM8K_MARK in text else text


def check_columns_exist(columns: Sequence[str], chosen: dict[str, str | None], where: str) -> None:
    """Raise naming the option, the closest column and all of them, for a column ``chosen`` (option -> column, None:
    not set) that ``columns`` lacks."""
    for option, column in chosen.items():
        if column is not None and column not in columns:
            raise ValueError(
                f"{option}={column!r}: {where} has no such column{closest_name(column, columns)}; its "
                f"columns: {list(columns)}."
            )


def check_mapping(
    columns: Sequence[str], mapping: dict[str, str | None], where: str, option_of: dict[str, str] | None = None
) -> dict[str, str]:
    """The ``{target: source}`` pairs of ``mapping`` that rename a column, after checking that each source column
    exists in ``columns`` and that no other column already has its target's name. ``option_of`` names the option
    that set each target, for the message (default ``<target>_column``)."""
    option_of = {target: (option_of or {}).get(target, f"{target}_column") for target in mapping}
    check_columns_exist(columns, {option_of[target]: source for target, source in mapping.items()}, where)
    sources = [source for source in mapping.values() if source is not None]
    if len(set(sources)) < len(sources):
        raise ValueError(
            f"{' and '.join(option_of[t] for t in mapping if mapping[t] is not None)} name the same "
            f"column of {where}; each names its own."
        )
    renames = {}
    for target, source in mapping.items():
        option = option_of[target]
        if source is None:
            continue
        if source != target and target in columns:
            raise ValueError(
                f"{option}={source!r} would read {source!r} as {target!r}, but {where} has a {target!r} "
                f"column too. Drop {option}, or remove or rename one of the two columns."
            )
        if source != target:
            renames[target] = source
    return renames


def training_renames(
    columns: Sequence[str], prompt_column: str | None, answer_column: str | None, where: str
) -> dict[str, str]:
    """:func:`check_mapping` of ``prompt_column`` to ``prompt`` and ``answer_column`` to ``solution``."""
    return check_mapping(
        columns,
        {"prompt": prompt_column, "solution": answer_column},
        where,
        {"prompt": "prompt_column", "solution": "answer_column"},
    )


def map_training_columns(
    dataset, prompt_column: str | None = None, answer_column: str | None = None, where: str = "the training dataset"
):
    """``dataset`` with ``prompt_column`` read as ``prompt`` and ``answer_column`` as ``solution`` (the math rewards'
    gold answer); GSM8K-style answers in ``solution`` become their final answer (logged)."""
    renames = training_renames(dataset.column_names, prompt_column, answer_column, where)
    for target, source in renames.items():
        dataset = dataset.rename_column(source, target)
    if "solution" not in dataset.column_names:
        return dataset
    worked = sum(isinstance(value, str) and GSM8K_MARK in value for value in dataset["solution"])
    if worked:
        logger.warning(
            "%s: %d of %d gold answers are GSM8K worked solutions ('... #### 42'); each is read as the "
            "text after its last '####'.",
            where,
            worked,
            len(dataset),
        )
        dataset = dataset.map(lambda row: {"solution": gold_answer(row["solution"])}, desc="GSM8K final answers")
    return dataset
