"""Verifiable math rewards for RiskPO / GRPO training, and a registry to pick them by name from a config.

The registry also names the multi-modal track's reward, ``geometry_accuracy`` (Geometry3K). The code track's ``code``
reward, built from its recipe's ``code_sandbox:`` settings, is added to :data:`REWARD_BUILDERS` by
:mod:`riskpo_trl.tracks`, so this layer never imports the sandbox.

Why not just ``trl.rewards.accuracy_reward``? TRL's reward (which we also register, as ``trl_accuracy``) only reads
LaTeX answers (``\\boxed{}`` or ``$...$``) and lets math-verify match *any* expression of the completion. The paper's
setting scores the model's *final* answer: :func:`riskpo_trl.rewards.grading.verify_answer` (re-exported here) grades
it at an anchor: the last ``\\boxed{}``, else an explicit answer line ("The answer is", "Answer:", "####"), else a
final line that is an answer on its own; an expression in mid-text is no answer. The evaluator uses the same
function, so training rewards and benchmark scores agree. ``geometry_accuracy`` is the same grader under the multi-modal track's
name.

The ``verl_*`` rewards are the graders the RiskPO authors' published runs used (:mod:`riskpo_trl.rewards.verl_graders`),
for reproducing those runs: ``verl_gsm8k`` (strict ``#### <number>``, 1/0), ``verl_math`` (last ``\\boxed{}``, string
equivalence, 1/0), ``verl_math_dapo`` (``Answer:`` line, +1/-1) and ``verl_by_source``, which picks one of them per row
from its ``data_source`` column as verl does (GSM8K rows strict, MATH rows boxed, DAPO rows ``Answer:``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl.rewards import accuracy_reward, think_format_reward

from ..registry import Registry, unimported_hint
from .completions import completion_text
from .grading import NO_ANSWER_READ, final_answer_preview, last_boxed, verify_answer
from .verl_graders import DAPO_ANSWER, GRADERS_BY_SOURCE, GSM8K_STRICT, MATH_EQUIV, Grader, grader_for_source

__all__ = [
    "REWARD_BUILDERS",
    "REWARD_FUNCS",
    "boxed_format_reward",
    "geometry_accuracy_reward",
    "get_reward_funcs",
    "last_boxed",
    "math_verify_reward",
    "verify_answer",
    "verl_by_source_reward",
    "verl_gsm8k_reward",
    "verl_math_dapo_reward",
    "verl_math_reward",
]

RewardFunc = Callable[..., list[float | None]]


def _grade_pairs(
    completions: Sequence, solution: Sequence[str], graders: Sequence[Grader], log_extra: Callable | None
) -> list[float | None]:
    """Each completion graded against its ``solution`` by its grader; what each grader read as the answer goes to
    the trainer's completions table (``log_extra``) as ``final_answer``."""
    if len(completions) != len(solution):
        raise ValueError(f"Got {len(completions)} completions but {len(solution)} solutions; they must pair up.")
    texts = [completion_text(c) for c in completions]
    rewards = [grader.score(text, str(gold)) for grader, text, gold in zip(graders, texts, solution)]
    if log_extra is not None:
        log_extra("final_answer", [grader.answer(text) or NO_ANSWER_READ for grader, text in zip(graders, texts)])
    return rewards


# math-verify on the anchored final answer; the completions table shows what it read, or "-".
MATH_VERIFY = Grader(verify_answer, final_answer_preview)


def math_verify_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float | None]:
    """Binary accuracy of each completion's final answer against its ``solution`` column (1.0 / 0.0, None if the
    gold answer is unparseable). The trainer passes the dataset's ``solution`` column as a keyword argument."""
    return _grade_pairs(completions, solution, [MATH_VERIFY] * len(completions), kwargs.get("log_extra"))


def geometry_accuracy_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float | None]:
    """:func:`math_verify_reward` under the Geometry3K track's name (logged as ``rewards/geometry_accuracy_reward``):
    Geometry3K's answers are numbers and expressions, graded by the same final-answer verifier."""
    return math_verify_reward(completions, solution, **kwargs)


_BOXED_AT_END = re.compile(r"\\boxed\{.*\}[\s.$\\)\]]*\Z", re.DOTALL)


def boxed_format_reward(completions: Sequence, **kwargs) -> list[float]:
    """1.0 if the completion ends with its answer in ``\\boxed{}`` (what the prompt template asks for), else 0.0."""
    return [float(bool(_BOXED_AT_END.search(completion_text(c).rstrip()))) for c in completions]


def verl_gsm8k_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """verl's strict GSM8K scorer: 1.0 if the last ``#### <number>`` of the completion's last 300 characters equals
    ``solution`` as a string (commas dropped), else 0.0. A ``\\boxed{}`` answer scores 0.0."""
    return _grade_pairs(completions, solution, [GSM8K_STRICT] * len(completions), kwargs.get("log_extra"))


def verl_math_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """verl's MATH scorer: 1.0 if the last ``\\boxed{}`` equals ``solution`` after the Hendrycks string
    normalisation (no algebra: ``\\frac{2}{4}`` is not ``\\frac{1}{2}``), else 0.0."""
    return _grade_pairs(completions, solution, [MATH_EQUIV] * len(completions), kwargs.get("log_extra"))


def verl_math_dapo_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """verl's DAPO-Math scorer: 1.0 if the last ``Answer:`` line of the completion's last 300 characters equals
    ``solution`` after the Minerva normalisation, else -1.0."""
    return _grade_pairs(completions, solution, [DAPO_ANSWER] * len(completions), kwargs.get("log_extra"))


def _source_grader(source: str) -> Grader:
    grader = grader_for_source(source)
    if grader is None:
        raise ValueError(
            f"verl_by_source has no grader for data_source={source!r}; it grades {sorted(GRADERS_BY_SOURCE)} (and "
            "aime* rows) as verl does. Train on those datasets, or name one grader in reward_funcs (verl_gsm8k, "
            "verl_math, verl_math_dapo) or math_verify."
        )
    return grader


def verl_by_source_reward(
    completions: Sequence, solution: Sequence[str], data_source: Sequence[str], **kwargs
) -> list[float]:
    """verl's ``default_compute_score`` on the math data: each row graded by its ``data_source``'s grader (GSM8K:
    ``verl_gsm8k``, MATH: ``verl_math``, DAPO-Math-17k and AIME: ``verl_math_dapo``), what the RiskPO authors'
    scripts ran. The adapters of :mod:`riskpo_trl.data` write ``data_source`` (the dataset's Hub id)."""
    graders = [_source_grader(source) for source in data_source]
    return _grade_pairs(completions, solution, graders, kwargs.get("log_extra"))


def _check_sources(dataset: Any) -> None:
    """Run by the trainer's dataset checks before training: every ``data_source`` of ``dataset`` has a grader."""
    for source in dataset.unique("data_source"):
        _source_grader(source)


verl_by_source_reward.check_dataset = _check_sources


REWARD_FUNCS: Registry[RewardFunc] = Registry("reward_funcs")
REWARD_FUNCS.add("math_verify", math_verify_reward)
REWARD_FUNCS.add("boxed_format", boxed_format_reward)
# TRL's own rewards, for comparison: LaTeX-only accuracy and the <think>...</think> format.
REWARD_FUNCS.add("trl_accuracy", accuracy_reward)
REWARD_FUNCS.add("think_format", think_format_reward)
# Multi-modal track (Geometry3K): math-verify on the last \boxed{} against the `solution` column.
REWARD_FUNCS.add("geometry_accuracy", geometry_accuracy_reward)
# The RiskPO authors' graders (verl 0.4.1's stock scorers), to reproduce their runs.
REWARD_FUNCS.add("verl_gsm8k", verl_gsm8k_reward)
REWARD_FUNCS.add("verl_math", verl_math_reward)
REWARD_FUNCS.add("verl_math_dapo", verl_math_dapo_reward)
REWARD_FUNCS.add("verl_by_source", verl_by_source_reward)


# Rewards built from settings (a block of the recipe, e.g. ``code_sandbox:``): name -> builder(settings) -> reward.
# riskpo_trl.tracks adds the code track's "code"; this layer never imports a track.
REWARD_BUILDERS: Registry[Callable[[Mapping[str, Any] | None], RewardFunc]] = Registry("reward_funcs")

# TRL's names for the rewards registered above under ours, offered when one of them is given.
TRL_REWARD_NAMES = {"accuracy_reward": "trl_accuracy", "think_format_reward": "think_format"}
REWARD_FUNCS.aliases.update(TRL_REWARD_NAMES)


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
    REWARD_FUNCS.check_all(
        names, also=REWARD_BUILDERS, otherwise=unimported_hint("riskpo_trl.tracks", "the code reward")
    )
    settings = settings or {}
    stray = [name for name in settings if name not in REWARD_BUILDERS]
    if stray:
        raise ValueError(f"Settings given for {stray}, which take none; only {sorted(REWARD_BUILDERS)} do.")
    return [
        REWARD_BUILDERS[name](settings.get(name)) if name in REWARD_BUILDERS else REWARD_FUNCS[name] for name in names
    ]
