"""Pass@k and Avg@k: pure functions of per-problem correctness counts.

Conventions follow the paper (and Chen et al., 2021): for a problem with ``n`` sampled completions of which ``c``
are correct, the unbiased estimate of Pass@k (the chance that at least one of ``k`` completions drawn without
replacement is correct) is ``1 - C(n - c, k) / C(n, k)``. Avg@k is the mean accuracy over the sampled completions,
an unbiased estimate of Pass@1. Benchmark scores are the mean over problems.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"n={n}: a problem needs at least one sampled completion.")
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct completions out of n={n} is impossible; need 0 <= c <= n.")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1.")
    if k > n:
        raise ValueError(
            f"Pass@{k} needs at least k={k} samples per problem, but only n={n} were drawn. Sample more completions "
            f"(n >= {k}) or drop k={k}."
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k estimate ``1 - C(n - c, k) / C(n, k)`` for one problem with ``c`` of ``n`` samples correct.

    Computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which equals the binomial ratio but never forms a
    binomial coefficient, so it is exact enough and fast for any ``n`` (thousands of samples included).
    """
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def avg_at_k(correct: Sequence[float | bool]) -> float:
    """Avg@k for one problem: the mean score of its ``k = len(correct)`` sampled completions."""
    if len(correct) == 0:
        raise ValueError("avg_at_k needs at least one sampled completion's score.")
    return sum(float(x) for x in correct) / len(correct)


def mean_pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> float:
    """Benchmark Pass@k: :func:`pass_at_k` averaged over problems (``num_samples[i]``, ``num_correct[i]``)."""
    if len(num_samples) != len(num_correct):
        raise ValueError(
            f"{len(num_samples)} sample counts but {len(num_correct)} correct counts; give one per problem."
        )
    if len(num_samples) == 0:
        raise ValueError("mean_pass_at_k needs at least one problem.")
    return sum(pass_at_k(n, c, k) for n, c in zip(num_samples, num_correct)) / len(num_samples)


def pass_at_k_curve(num_samples: Sequence[int], num_correct: Sequence[int], ks: Iterable[int]) -> dict[int, float]:
    """Benchmark Pass@k for each ``k`` in ``ks`` (sorted): the points of a Pass@k-versus-k curve."""
    return {k: mean_pass_at_k(num_samples, num_correct, k) for k in sorted(set(ks))}


def default_ks(n: int) -> list[int]:
    """Powers of two up to ``n``, plus ``n`` itself: the k's of a Pass@k curve from ``n`` samples per problem."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def benchmark_metrics(per_problem_scores: Sequence[Sequence[float]], ks: Iterable[int]) -> dict[str, float]:
    """Pass@k for each ``k`` and Avg@n of one benchmark, from each problem's list of sample scores (1.0 = correct).

    A sample counts as correct when its score is >= 0.5 (math-verify scores are 0 or 1). Keys: ``pass@{k}`` and
    ``avg@{n}`` where ``n`` is the number of samples per problem (the smallest, if problems differ).
    """
    if len(per_problem_scores) == 0:
        raise ValueError("benchmark_metrics needs at least one problem's scores.")
    num_samples = [len(scores) for scores in per_problem_scores]
    num_correct = [sum(1 for s in scores if s >= 0.5) for scores in per_problem_scores]
    metrics = {f"pass@{k}": value for k, value in pass_at_k_curve(num_samples, num_correct, ks).items()}
    n = min(num_samples)
    metrics[f"avg@{n}"] = sum(avg_at_k(scores) for scores in per_problem_scores) / len(per_problem_scores)
    return metrics
