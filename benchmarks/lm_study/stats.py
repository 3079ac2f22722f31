"""Problem-level statistics for comparing policies on one fixed test set: bootstrap CIs over the test problems
(paired: both policies are scored on the same problems), and over seeds then problems (two-level).

Pure numpy, no model: a value array holds one number per (seed, problem), e.g. a problem's exact Pass@k under the
weights one seed ended with. Resampling draws whole seeds and whole problems with replacement; the percentile
interval is reported. Every function takes its own ``seed``, so a table is reproducible."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A difference (or a level) with its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float
    share_at_or_below_zero: float  # share of bootstrap replicates <= 0
    seeds: tuple[int, ...]  # seeds resampled per value array (1 = no seed level)
    problems: int
    level: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict:
        return asdict(self)


def _as_matrix(values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0 or array.shape[0] == 0:
        raise ValueError(f"Expected values shaped (problems,) or (seeds, problems), got shape {array.shape}.")
    return array


def _percentiles(replicates: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def _seed_weights(rng: np.random.Generator, seeds: int, resamples: int) -> np.ndarray:
    return rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=resamples) / seeds


def two_level_bootstrap(a, b=None, *, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> Interval:
    """Mean of ``a`` minus mean of ``b`` (or the mean of ``a`` alone), each shaped (seeds, problems) over the same
    problems. Each replicate draws seeds with replacement for each array independently (seed ``s`` of one method has
    nothing in common with seed ``s`` of another), then one set of problems with replacement shared by both arrays
    (the pairing), and takes the difference of the means. An array with one row (e.g. the start, which has no seeds)
    contributes problem-level variation only; with one row each this is :func:`paired_problem_bootstrap`'s
    distribution."""
    a = _as_matrix(a)
    b = _as_matrix(b) if b is not None else np.zeros((1, a.shape[1]))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"Paired arrays need the same problems: {a.shape[1]} vs {b.shape[1]} columns.")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}.")
    rng = np.random.default_rng(seed)
    problems = a.shape[1]
    per_problem = _seed_weights(rng, a.shape[0], resamples) @ a - _seed_weights(rng, b.shape[0], resamples) @ b
    problem_weights = rng.multinomial(problems, np.full(problems, 1 / problems), size=resamples) / problems
    replicates = (per_problem * problem_weights).sum(axis=1)
    low, high = _percentiles(replicates, level)
    return Interval(
        estimate=float(a.mean() - b.mean()),
        low=low,
        high=high,
        share_at_or_below_zero=float((replicates <= 0).mean()),
        seeds=(a.shape[0], b.shape[0]),
        problems=problems,
        level=level,
    )


def paired_problem_bootstrap(a, b=None, *, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> Interval:
    """Problem-level only: average each array over its seeds first, then resample the problems of the per-problem
    difference. Ignores seed-to-seed variation (compare :func:`two_level_bootstrap`)."""
    a = _as_matrix(a).mean(axis=0, keepdims=True)
    b = _as_matrix(b).mean(axis=0, keepdims=True) if b is not None else None
    return two_level_bootstrap(a, b, resamples=resamples, seed=seed, level=level)


def verdict(interval: Interval, claimed_sign: int = 1) -> str:
    """The pre-registered rule (``EXACT_VERDICT_RULE``): ``supported`` if the interval excludes 0 on the claimed
    side, ``contradicted`` if it excludes 0 on the other side, ``not significant`` otherwise."""
    if claimed_sign not in (1, -1):
        raise ValueError(f"claimed_sign must be 1 or -1, got {claimed_sign}.")
    low, high = interval.low * claimed_sign, interval.high * claimed_sign
    if min(low, high) > 0:
        return "supported"
    if max(low, high) < 0:
        return "contradicted"
    return "not significant"
