"""A scorer per benchmark kind: each grades a problem's sampled completions with that track's own grader.

- ``math``: the final answer against ``answer`` with math-verify (the ``math_verify`` training reward's grader);
- ``geometry``: the same verifier against ``solution`` (the ``geometry_accuracy`` reward);
- ``code``: the last ```python block run on the row's ``tests`` in the sandbox (the ``code`` reward).

A score is 1.0 / 0.0; a problem whose gold answer or tests cannot be graded counts every completion 0.0 and is
reported as unscorable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..rewards.grading import verify_answer

# grader(completion_text, gold) -> 1.0 / 0.0, or None when the gold answer cannot be parsed.
Scorer = Callable[[str, str], "float | None"]


def score_samples(texts: list[str], gold: str, scorer: Scorer) -> tuple[list[float], bool]:
    """Each completion's score (0/1) and whether the gold answer was unscorable (then every completion counts 0)."""
    scores, gold_unscorable = [], False
    for text in texts:
        try:
            score = scorer(text, gold)
        except Exception:  # a verifier failure on one completion must not end the run: count it wrong
            score = 0.0
        if score is None:
            gold_unscorable = True
            score = 0.0
        scores.append(float(score))
    return scores, gold_unscorable


class AnswerScorer:
    """Grades each completion's final answer against the row's ``gold_column`` (math and geometry benchmarks)."""

    def __init__(self, gold_column: str, grader: Scorer = verify_answer):
        self.gold_column = gold_column
        self.grader = grader

    def gold(self, row: Mapping[str, Any]) -> str:
        return str(row[self.gold_column])

    def score(self, texts: list[str], row: Mapping[str, Any]) -> tuple[list[float], bool]:
        return score_samples(texts, self.gold(row), self.grader)


class CodeScorer:
    """Runs each completion's program on the row's ``tests`` in the sandbox (:class:`riskpo_trl.code.CodeReward`)."""

    def __init__(self, sandbox_settings: Mapping[str, Any] | None = None):
        from ..code.reward import code_reward_from_settings

        self.reward = code_reward_from_settings(sandbox_settings)

    def gold(self, row: Mapping[str, Any]) -> None:
        return None  # the tests stay in the dataset; samples.jsonl would repeat them per problem

    def score(self, texts: list[str], row: Mapping[str, Any]) -> tuple[list[float], bool]:
        rewards = self.reward(texts, [row["tests"]] * len(texts))
        unscorable = any(reward is None for reward in rewards)  # missing or unparseable tests
        return [0.0 if unscorable else float(reward) for reward in rewards], unscorable


def scorer_for(
    kind: str, *, math_grader: Scorer | None = None, sandbox_settings: Mapping[str, Any] | None = None
) -> AnswerScorer | CodeScorer:
    """The scorer of a benchmark kind; ``math_grader`` replaces math-verify for the math kind."""
    if kind == "math":
        return AnswerScorer("answer", math_grader or verify_answer)
    if kind == "geometry":
        return AnswerScorer("solution")
    if kind == "code":
        return CodeScorer(sandbox_settings)
    raise ValueError(f"No scorer for benchmark kind {kind!r}; known kinds: 'math', 'geometry', 'code'.")
