"""Which reward function left completions unscored, and how: ``None`` (the function does not apply) or NaN (a value
that is not a number, usually a bug in the function); and a reward output of the wrong shape, named.

TRL turns both into NaN before the advantage sees the rewards, and warns that every function "returned None" even
when one returned NaN. :func:`account_rewards` wraps a trainer's ``_calculate_rewards`` (on the object, any
GRPO-family class): while a batch is scored, each function's output is checked and each kind counted per function
(:func:`counting_unscored_rewards`, into ``trainer.unscored_counts``), so the warnings (:func:`warn_unscored`) name
the function, the kind and how many. Messages only: the rewards TRL computes are unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.utils import logging as transformers_logging

from .. import compat
from ..compat.generation import trl_awaits

# GRPOTrainer's warning for a completion no reward function scored; it says None for NaN too.
TRL_ALL_NONE_WARNING = "All reward functions returned None"
TRL_GRPO_LOGGER = "trl.trainer.grpo_trainer"

logger = transformers_logging.get_logger(__name__)


def account_rewards(trainer: Any) -> None:
    """Wrap ``trainer._calculate_rewards``: the batch is scored while each reward function's output is checked and its
    None and NaN counted; the NaN ones and the completions no function scored are then named in a warning."""
    calculate = trainer._calculate_rewards

    def calculate_rewards(inputs, prompts, completions, completion_ids_list):
        with counting_unscored_rewards(trainer) as unscored:
            rewards_per_func = calculate(inputs, prompts, completions, completion_ids_list)
        compat.check_gathered_rewards(len(rewards_per_func), len(prompts), trainer.accelerator.num_processes)
        start = trainer.accelerator.process_index * len(prompts)  # the rewards come back gathered over all processes
        warn_unscored(unscored, rewards_per_func[start : start + len(prompts)], completions)
        return rewards_per_func

    trainer._calculate_rewards = calculate_rewards


@dataclass
class UnscoredCounts:
    """Per reward function (in the trainer's order), how many completions of one batch on this process it returned
    None and NaN for."""

    names: list[str]
    none: list[int] = field(default_factory=list)
    nan: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.none = self.none or [0] * len(self.names)
        self.nan = self.nan or [0] * len(self.names)

    def why_nothing_scored(self, reward_funcs: Sequence[Any]) -> str:
        """Why a run's batches had nothing scorable, for its stop: a reward whose own machinery failed (the code
        sandbox's ``unscorable_causes``) says so, as that is then the reason; else the data's likely mistakes."""
        machinery = [
            f"{name}: {cause}"
            for name, func in zip(self.names, reward_funcs)
            if callable(getattr(func, "unscorable_causes", None)) and (cause := func.unscorable_causes())
        ]
        if machinery:
            return (
                f"the reward's own machinery failed, not the data: {'; '.join(machinery)}. Fix that cause (see the "
                "warnings above and docs/code_sandbox.md)"
            )
        return (
            f"no reward function ({', '.join(self.names)}) scored any completion (last batch on this process: "
            f"{self.describe()}), so every advantage was 0. None means a function does not apply; NaN is usually a "
            "bug in the function. Check that the reward functions fit the dataset (e.g. the format of the "
            "reference-answer column they read) and the completions (e.g. max_completion_length long enough to reach "
            "an answer)"
        )

    def describe(self) -> str:
        """``'has_digit: 6 NaN; math_verify_reward: 3 None'`` for the functions that left anything unscored."""
        parts = []
        for name, none, nan in zip(self.names, self.none, self.nan):
            kinds = [f"{count} {kind}" for count, kind in ((nan, "NaN"), (none, "None")) if count]
            if kinds:
                parts.append(f"{name}: {', '.join(kinds)}")
        return "; ".join(parts)


def count_unscored(values: Sequence[Any]) -> tuple[int, int]:
    """``(None count, NaN count)`` of one reward function's output."""
    none = sum(value is None for value in values)
    nan = 0
    for value in values:
        try:
            nan += value is not None and math.isnan(float(value))
        except (TypeError, ValueError):
            pass
    return none, nan


def check_reward_output(name: str, output: Any, num_completions: int | None) -> None:
    """Raise an error naming reward function ``name`` unless ``output`` holds one value per completion (for a float,
    TRL's own is a bare "'float' object is not iterable")."""
    try:
        length = None if isinstance(output, (str, bytes, Mapping)) else len(output)
    except TypeError:  # a number, a 0-d tensor, a generator
        length = None
    if length is None:
        raise TypeError(
            f"Reward function {name} returned {type(output).__name__} {str(output)[:50]!r}; it must return a list "
            f"with one float (or None) per completion" + (f" ({num_completions} here)." if num_completions else ".")
        )
    if num_completions is not None and length != num_completions:
        raise ValueError(
            f"Reward function {name} returned {length} values for {num_completions} completions; it must return "
            "one float (or None) per completion, in order."
        )


def _counting(func: Callable, index: int, owner: Any) -> Callable:
    """``func`` checking its output's shape and counting what it leaves unscored into ``owner.unscored_counts`` (the
    current batch's)."""

    def record(output, kwargs):
        completions = kwargs.get("completions")
        check_reward_output(
            owner.unscored_counts.names[index], output, len(completions) if completions is not None else None
        )
        none, nan = count_unscored(output)
        owner.unscored_counts.none[index] += none
        owner.unscored_counts.nan[index] += nan
        return output

    if trl_awaits(func):  # the wrapper must be awaited exactly when TRL would await func

        async def counted_async(*args, **kwargs):
            return record(await func(*args, **kwargs), kwargs)

        return functools.wraps(func)(counted_async)

    return functools.wraps(func)(lambda *args, **kwargs: record(func(*args, **kwargs), kwargs))


class _DropAllNoneWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TRL_ALL_NONE_WARNING not in record.getMessage()  # accelerate prefixes "[RANK n] "


@contextlib.contextmanager
def _holding_back_trl_all_none_warning() -> Iterator[None]:
    """TRL's warning says None for NaN too; while TRL scores a batch it is held back, and the caller reports from the
    counts instead. The filter is on TRL's GRPO logger only, and only for the duration of the block."""
    trl_logger = logging.getLogger(TRL_GRPO_LOGGER)
    drop = _DropAllNoneWarning()
    trl_logger.addFilter(drop)
    try:
        yield
    finally:
        trl_logger.removeFilter(drop)


@contextlib.contextmanager
def counting_unscored_rewards(trainer: Any) -> Iterator[UnscoredCounts]:
    """While TRL scores a batch: each of ``trainer``'s reward functions (reward models, which always score, are left as
    they are) checks its output's shape and counts what it leaves unscored into ``trainer.unscored_counts``, and TRL's
    all-None warning (which says None for NaN too) is held back. ``reward_funcs`` holds the user's own objects again
    as soon as the block ends, so they stay inspectable as given."""
    trainer.unscored_counts = UnscoredCounts(list(trainer.reward_func_names))
    original = trainer.reward_funcs
    trainer.reward_funcs = [
        func if isinstance(func, nn.Module) else _counting(func, index, trainer) for index, func in enumerate(original)
    ]
    try:
        with _holding_back_trl_all_none_warning():
            yield trainer.unscored_counts
    finally:
        trainer.reward_funcs = original


def warn_unscored(unscored: UnscoredCounts, local_rewards: torch.Tensor, completions: list) -> None:
    """Name NaN rewards as NaN (TRL reports them as None), and the completions no reward function scored
    (``local_rewards``: this process's rows of the rewards per function)."""
    total = len(completions)
    for name, nan in zip(unscored.names, unscored.nan):
        if nan:
            logger.warning(
                f"Reward function {name} returned NaN for {nan} of {total} completions. NaN, like None, leaves a "
                "completion unscored by that function; if NaN is not meant as 'does not apply', fix the function "
                "(return None for that)."
            )
    unscorable = torch.isnan(local_rewards).all(dim=1)
    if unscorable.any():
        first = completions[int(unscorable.nonzero()[0, 0])]
        logger.warning(
            f"{int(unscorable.sum())} of {total} completions were scored by no reward function ("
            f"{unscored.describe()}); they get advantage 0. First of them: {str(first)[:200]!r}"
        )
