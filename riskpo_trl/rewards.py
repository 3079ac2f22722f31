"""Verifiable math rewards for RiskPO / GRPO training, and a registry to pick them by name from a config.

The registry also names the other tracks' rewards: ``geometry_accuracy`` (Geometry3K) and ``code``, which is built
from its recipe's ``code_sandbox:`` settings (:data:`REWARD_BUILDERS`).

Why not just ``trl.rewards.accuracy_reward``? TRL's reward (which we also register, as ``trl_accuracy``) only reads
LaTeX answers (``\\boxed{}`` or ``$...$``) and lets math-verify match *any* expression of the completion. The paper's
setting scores the model's *final* answer: :func:`riskpo_trl.grading.verify_answer` (re-exported here) grades the
last ``\\boxed{}`` when there is one, and otherwise the plain-text tail; the evaluator uses the same function, so
training rewards and benchmark scores agree. ``geometry_accuracy`` is the same grader under the multi-modal track's
name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl.rewards import accuracy_reward, think_format_reward

from .code.reward import code_reward_from_settings
from .grading import final_answer_preview, last_boxed, verify_answer
from .text import completion_text

__all__ = [
    "REWARD_BUILDERS",
    "REWARD_FUNCS",
    "boxed_format_reward",
    "geometry_accuracy_reward",
    "get_reward_funcs",
    "last_boxed",
    "math_verify_reward",
    "verify_answer",
]

RewardFunc = Callable[..., list[float | None]]


def math_verify_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float | None]:
    """Binary accuracy of each completion's final answer against its ``solution`` column (1.0 / 0.0, None if the
    gold answer is unparseable). The trainer passes the dataset's ``solution`` column as a keyword argument."""
    if len(completions) != len(solution):
        raise ValueError(f"Got {len(completions)} completions but {len(solution)} solutions; they must pair up.")
    texts = [completion_text(c) for c in completions]
    rewards = [verify_answer(text, gold) for text, gold in zip(texts, solution)]
    log_extra = kwargs.get("log_extra")
    if log_extra is not None:  # shown in the trainer's completions table
        log_extra("final_answer", [final_answer_preview(text) for text in texts])
    return rewards


def geometry_accuracy_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float | None]:
    """:func:`math_verify_reward` under the Geometry3K track's name (logged as ``rewards/geometry_accuracy_reward``):
    Geometry3K's answers are numbers and expressions, graded by the same final-answer verifier."""
    return math_verify_reward(completions, solution, **kwargs)


_BOXED_AT_END = re.compile(r"\\boxed\{.*\}[\s.$\\)\]]*\Z", re.DOTALL)


def boxed_format_reward(completions: Sequence, **kwargs) -> list[float]:
    """1.0 if the completion ends with its answer in ``\\boxed{}`` (what the prompt template asks for), else 0.0."""
    return [float(bool(_BOXED_AT_END.search(completion_text(c).rstrip()))) for c in completions]


REWARD_FUNCS: dict[str, RewardFunc] = {
    "math_verify": math_verify_reward,
    "boxed_format": boxed_format_reward,
    # TRL's own rewards, for comparison: LaTeX-only accuracy and the <think>...</think> format.
    "trl_accuracy": accuracy_reward,
    "think_format": think_format_reward,
    # Multi-modal track (Geometry3K): math-verify on the last \boxed{} against the `solution` column.
    "geometry_accuracy": geometry_accuracy_reward,
}

# Rewards built from settings (a block of the recipe, e.g. ``code_sandbox:``): name -> builder(settings) -> reward.
REWARD_BUILDERS: dict[str, Callable[[Mapping[str, Any] | None], RewardFunc]] = {
    # Code track: runs the completion's last ```python block on the row's `tests` in the sandbox.
    "code": code_reward_from_settings,
}


def get_reward_funcs(
    names: str | Sequence[str], settings: Mapping[str, Mapping[str, Any] | None] | None = None
) -> list[RewardFunc]:
    """The reward functions registered under ``names``, in order; raises naming any unknown name.

    ``settings`` maps a name of :data:`REWARD_BUILDERS` to the settings its reward is built from (missing: defaults).
    """
    if isinstance(names, str):
        names = [names]
    if not names:
        raise ValueError(f"No reward function given; choose from {sorted([*REWARD_FUNCS, *REWARD_BUILDERS])}.")
    unknown = [name for name in names if name not in REWARD_FUNCS and name not in REWARD_BUILDERS]
    if unknown:
        raise ValueError(
            f"Unknown reward function(s) {unknown}; valid names are {sorted([*REWARD_FUNCS, *REWARD_BUILDERS])}."
        )
    settings = settings or {}
    stray = [name for name in settings if name not in REWARD_BUILDERS]
    if stray:
        raise ValueError(f"Settings given for {stray}, which take none; only {sorted(REWARD_BUILDERS)} do.")
    return [
        REWARD_BUILDERS[name](settings.get(name)) if name in REWARD_BUILDERS else REWARD_FUNCS[name] for name in names
    ]
