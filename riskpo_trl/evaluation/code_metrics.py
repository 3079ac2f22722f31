"""pass@k for code over samples drawn elsewhere: count how many of each problem's programs pass in the sandbox,
estimate pass@k unbiasedly. (``riskpo-eval --benchmarks livecodebench_v5`` samples and grades in one go.)"""

from __future__ import annotations

from collections.abc import Sequence

from ..code.reward import CodeReward
from .metrics import mean_pass_at_k


def correct_counts(samples: Sequence[Sequence], tests: Sequence[str], reward: CodeReward) -> list[int]:
    """Per problem, how many of its sampled completions pass all its tests (unscorable problems raise)."""
    if len(samples) != len(tests):
        raise ValueError(f"Got samples for {len(samples)} problems but tests for {len(tests)}.")
    flat = [completion for per_problem in samples for completion in per_problem]
    flat_tests = [t for per_problem, t in zip(samples, tests) for _ in per_problem]
    scores = reward(flat, flat_tests)
    if any(score is None for score in scores):
        raise ValueError("Some problems have missing or unparseable tests; fix their 'tests' column first.")
    counts, start = [], 0
    for per_problem in samples:
        counts.append(int(sum(scores[start : start + len(per_problem)])))
        start += len(per_problem)
    return counts


def code_pass_at_k(samples: Sequence[Sequence], tests: Sequence[str], ks: Sequence[int],
                   reward: CodeReward) -> dict[str, float]:
    """Mean pass@k over problems for each k (every problem needs at least max(ks) samples)."""
    counts = correct_counts(samples, tests, reward)
    return {f"pass@{k}": mean_pass_at_k([len(s) for s in samples], counts, k) for k in ks}
