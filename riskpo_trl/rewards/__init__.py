"""Rewards and graders, in one vocabulary:

- a *grader* scores one completion's text against a reference answer (``grading.verify_answer``, the math-verify
  grader; ``verl_graders``: the verl scorers of the authors' runs, each a ``Grader`` with its answer extractor);
- a *reward* is a TRL reward function, a batch of completions in and one score (or ``None``) per completion out, built
  on a grader and registered by name in ``registry`` (``REWARD_FUNCS``, ``REWARD_BUILDERS``) for recipes to pick;
- evaluation's per-benchmark *scorers* (``riskpo_trl.evaluation.scorers``) call the same graders.

The names of ``registry`` and ``grading`` are importable from here; they load on first use, so a module that only
needs a grader does not load TRL, and the code sandbox is only imported when the ``code`` reward is built.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "completions": ("completion_text",),
    "grading": ("final_answer_preview", "last_boxed", "matching_brace", "verify_answer"),
    "registry": (
        "REWARD_BUILDERS",
        "REWARD_FUNCS",
        "boxed_format_reward",
        "geometry_accuracy_reward",
        "get_reward_funcs",
        "math_verify_reward",
        "verl_by_source_reward",
        "verl_gsm8k_reward",
        "verl_math_dapo_reward",
        "verl_math_reward",
    ),
}

if TYPE_CHECKING:
    from .completions import completion_text
    from .grading import final_answer_preview, last_boxed, matching_brace, verify_answer
    from .registry import (
        REWARD_BUILDERS,
        REWARD_FUNCS,
        boxed_format_reward,
        geometry_accuracy_reward,
        get_reward_funcs,
        math_verify_reward,
        verl_by_source_reward,
        verl_gsm8k_reward,
        verl_math_dapo_reward,
        verl_math_reward,
    )

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
