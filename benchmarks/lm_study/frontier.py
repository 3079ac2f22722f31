"""The Pass@1-Pass@k frontier (``FRONTIER_DEFINITION``) and its two-level bootstrap, pure numpy.

A run's trajectory is its checkpoints' mean test Pass@1 with each problem's Pass@k. :func:`values_at_levels` reads
Pass@k at matched Pass@1 levels (first crossing, linear interpolation, the same weight for every problem).
:func:`frontier_difference` compares two methods, each the upper envelope over its arms (rates), with the envelope
taken inside every resample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .stats import _percentiles, _seed_weights


def values_at_levels(pass1: np.ndarray, values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """(levels, problems): each problem's value at the first crossing of each Pass@1 level; NaN where the run never
    reaches it. ``pass1``: (checkpoints,) mean Pass@1, checkpoint 0 the start; ``values``: (checkpoints, problems)."""
    pass1 = np.asarray(pass1, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    out = np.full((len(levels), values.shape[1]), np.nan)
    for row, level in enumerate(levels):
        reached = np.flatnonzero(pass1 >= level)
        if not reached.size:
            continue
        c = int(reached[0])
        if c == 0:
            out[row] = values[0]
            continue
        weight = (level - pass1[c - 1]) / (pass1[c] - pass1[c - 1])  # pass1[c-1] < level <= pass1[c]
        out[row] = (1 - weight) * values[c - 1] + weight * values[c]
    return out


def arm_reaches(arm: np.ndarray) -> np.ndarray:
    """(levels,): whether every seed of ``arm`` (seeds, levels, problems) reaches each level."""
    return ~np.isnan(arm).any(axis=(0, 2))


def method_reaches(arms: list[np.ndarray]) -> np.ndarray:
    """(levels,): whether at least one arm of a method reaches each level with all its seeds."""
    return np.any([arm_reaches(a) for a in arms], axis=0)


def envelope(arms: list[np.ndarray], problem_weights: np.ndarray, seed_weights: list[np.ndarray]) -> np.ndarray:
    """(resamples, levels): per resample and level, the highest arm mean (``-inf`` where no arm reaches the level).
    ``problem_weights``: (resamples, problems); ``seed_weights[i]``: (resamples, seeds of arm i)."""
    best = np.full((problem_weights.shape[0], arms[0].shape[1]), -np.inf)
    for arm, weights in zip(arms, seed_weights):
        reaches = arm_reaches(arm)
        filled = np.nan_to_num(arm)  # levels not reached are masked below
        seeds, levels, problems = filled.shape
        per_seed = (filled.reshape(seeds * levels, problems) @ problem_weights.T).reshape(seeds, levels, -1)
        means = np.einsum("rs,slr->rl", weights, per_seed)
        best = np.maximum(best, np.where(reaches[None, :], means, -np.inf))
    return best


@dataclass(frozen=True)
class FrontierDifference:
    """The mean over the common levels of the variant's frontier minus the reference's, with its bootstrap CI."""

    estimate: float | None
    low: float | None
    high: float | None
    levels: tuple[float, ...]  # the levels averaged over (the interval clipped to the common range)
    seeds: tuple[tuple[int, ...], tuple[int, ...]]  # seeds per arm: variant's arms, reference's arms
    problems: int
    level: float

    def as_dict(self) -> dict:
        return asdict(self)


def frontier_difference(
    variant: list[np.ndarray],
    reference: list[np.ndarray],
    levels,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> FrontierDifference:
    """``variant`` and ``reference``: each a method's arms, (seeds, levels, problems) values at ``levels`` (NaN where
    a seed never reaches a level), on the same problems. Each replicate draws one set of problems (shared by every
    arm: the pairing), and each arm's seeds independently; takes each method's envelope over its arms per level,
    and averages the difference over the levels both methods reach."""
    levels = np.asarray(levels, dtype=np.float64)
    arms = [*variant, *reference]
    problems = arms[0].shape[2]
    if any(a.shape[1:] != (len(levels), problems) for a in arms):
        raise ValueError("Every arm needs values shaped (seeds, levels, problems) on the same levels and problems.")
    common = method_reaches(variant) & method_reaches(reference)
    seeds = (tuple(a.shape[0] for a in variant), tuple(a.shape[0] for a in reference))
    if not common.any():
        return FrontierDifference(None, None, None, (), seeds, problems, level)
    variant = [a[:, common] for a in variant]
    reference = [a[:, common] for a in reference]

    def difference(problem_weights, seed_weights):
        v = envelope(variant, problem_weights, seed_weights[: len(variant)])
        r = envelope(reference, problem_weights, seed_weights[len(variant) :])
        return (v - r).mean(axis=1)

    uniform = [np.full((1, a.shape[0]), 1 / a.shape[0]) for a in arms]
    estimate = float(difference(np.full((1, problems), 1 / problems), uniform)[0])
    rng = np.random.default_rng(seed)
    problem_weights = rng.multinomial(problems, np.full(problems, 1 / problems), size=resamples) / problems
    seed_weights = [_seed_weights(rng, a.shape[0], resamples) for a in arms]
    low, high = _percentiles(difference(problem_weights, seed_weights), level)
    return FrontierDifference(estimate, low, high, tuple(float(x) for x in levels[common]), seeds, problems, level)


def margin_verdict(low: float | None, high: float | None, margin: float) -> str:
    """``FRONTIER_VERDICT_RULE``: better / worse outside the margin, equivalent inside it, else undecided."""
    if low is None or high is None:
        return "no common Pass@1 level"
    if low > margin:
        return "better"
    if high < -margin:
        return "worse"
    if low >= -margin and high <= margin:
        return "equivalent"
    return "undecided"
