"""Construction-time checks of a trainer's datasets, so a missing column fails before the model loads with a message
that names it, rather than as a KeyError inside TRL at the first step."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# Keyword arguments GRPOTrainer passes to reward functions itself; every other one is read from a dataset column.
TRL_REWARD_KWARGS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                               "environments"})


def check_dataset_columns(train_dataset: Any, eval_dataset: Any, reward_funcs: Any) -> None:
    """Check that the training and evaluation datasets (a dataset, a dict of them, or None) have a ``prompt`` column
    and the columns each reward function reads, and pass each reward function's own ``check_dataset(dataset)`` if it
    has one; raise a ValueError naming what is missing and how to add it."""
    _check_split(train_dataset, reward_funcs, "training")
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
    for name, dataset in named:
        _check_split(dataset, reward_funcs, f"evaluation{f' ({name})' if name else ''}")


def reward_columns(reward_func: Any) -> list[str]:
    """Dataset columns a reward function needs: an explicit ``required_columns`` attribute, else the parameters of its
    signature that have no default and that GRPOTrainer does not pass itself."""
    declared = getattr(reward_func, "required_columns", None)
    if declared is not None:
        return list(declared)
    if not callable(reward_func) or isinstance(reward_func, str) or hasattr(reward_func, "config"):
        return []  # a Hub id or a reward model: it reads the text only
    try:
        parameters = inspect.signature(reward_func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name for p in parameters
        if p.default is inspect.Parameter.empty and p.name not in TRL_REWARD_KWARGS
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def _check_split(dataset: Any, reward_funcs: Any, split: str) -> None:
    """Fail at construction, naming the columns, rather than with a KeyError inside TRL at the first step."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:  # no dataset, or a streaming one that does not know its columns
        return
    if "prompt" not in columns:
        raise ValueError(
            f"The {split} dataset has no 'prompt' column (its columns: {columns}). RiskPOTrainer, like GRPOTrainer, "
            "reads each example's prompt from 'prompt': a string, or a list of chat messages [{'role': 'user', "
            "'content': ...}]. Rename or build that column (e.g. dataset.rename_column('question', 'prompt'), or the "
            "adapters in riskpo_trl.data)."
        )
    funcs: list[Callable] = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    for func in funcs:
        name = getattr(func, "__name__", type(func).__name__)
        missing = [column for column in reward_columns(func) if column not in columns]
        if missing:
            raise ValueError(
                f"The reward function {name} reads the column(s) {missing}, which the {split} dataset lacks (its "
                f"columns: {columns}). Add them to the dataset (e.g. the reference answer as 'solution'), or use a "
                "reward function that fits it."
            )
        check = getattr(func, "check_dataset", None)
        if check is not None and hasattr(dataset, "unique"):
            try:
                check(dataset)
            except ValueError as error:
                raise ValueError(f"The {split} dataset does not fit the reward function {name}: {error}") from None
