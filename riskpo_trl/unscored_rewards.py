"""Which reward function left completions unscored, and how: ``None`` (the function does not apply) or NaN (a value
that is not a number, usually a bug in the function).

TRL turns both into NaN before RiskPO sees the rewards, and warns that every function "returned None" even when one
returned NaN. While TRL calls the reward functions, `counting_unscored` wraps them to count each kind per function,
so the trainer's messages name the function, the kind and how many.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from trl.trainer.utils import is_async_callable

# GRPOTrainer's warning for a completion no reward function scored; it says None for NaN too.
TRL_ALL_NONE_WARNING = "All reward functions returned None"
TRL_GRPO_LOGGER = "trl.trainer.grpo_trainer"


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


def _counting(func: Callable, index: int, counts: UnscoredCounts) -> Callable:
    def record(output):
        none, nan = count_unscored(output)
        counts.none[index] += none
        counts.nan[index] += nan
        return output

    if is_async_callable(func):
        async def counted_async(*args, **kwargs):
            return record(await func(*args, **kwargs))

        return counted_async

    def counted(*args, **kwargs):
        return record(func(*args, **kwargs))

    return counted


class _DropAllNoneWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TRL_ALL_NONE_WARNING not in record.getMessage()  # accelerate prefixes "[RANK n] "


@contextlib.contextmanager
def counting_unscored(trainer: Any, names: list[str]) -> Iterator[UnscoredCounts]:
    """Within the block, ``trainer.reward_funcs`` count what they leave unscored into the yielded counts (reward
    models, which always score, are left as they are), and TRL's all-None warning is held back: the caller reports
    from the counts instead."""
    counts = UnscoredCounts(names)
    original = trainer.reward_funcs
    trainer.reward_funcs = [
        func if isinstance(func, nn.Module) else _counting(func, i, counts) for i, func in enumerate(original)
    ]
    trl_logger = logging.getLogger(TRL_GRPO_LOGGER)
    drop = _DropAllNoneWarning()
    trl_logger.addFilter(drop)
    try:
        yield counts
    finally:
        trainer.reward_funcs = original
        trl_logger.removeFilter(drop)
