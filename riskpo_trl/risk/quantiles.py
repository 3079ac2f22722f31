"""Order statistics of bundle scores: empirical quantiles (of a batch, or per bundle group) and spreads, and the
registry of quantile sources (where the advantage's quantiles come from: the config's ``quantile_source``).

A quantile source is one function registered by name (as verl's ``register_adv_est``)::

    @QUANTILE_SOURCES.register("median_split", help="...")
    def median_split_quantiles(bundle_scores, num_generations, levels, tracker):
        return q_alpha, q_beta   # floats, or one value per bundle

``bundle_scores`` are the batch's, ``num_generations`` bundles per group, ``levels`` the pair ``(alpha, beta)`` and
``tracker`` the :class:`~riskpo_trl.risk.QuantileTracker` (already stepped on a training batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..registry import Registry

Quantile = float | torch.Tensor
QuantileSource = Callable[[torch.Tensor, int, tuple[float, float], Any], tuple[Quantile, Quantile]]

QUANTILE_SOURCES: Registry[QuantileSource] = Registry("quantile_source", needs_help=True)


def as_tensor_like(value: Quantile, like: torch.Tensor) -> torch.Tensor:
    """A quantile (a float, a 0-d tensor or one value per bundle) on ``like``'s dtype and device."""
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def group_quantiles(bundle_scores: torch.Tensor, num_generations: int, levels: list[float]) -> torch.Tensor:
    """Empirical (linear) quantiles within each bundle group, repeated for every bundle: shape ``(bundles, levels)``.

    This is where the authors' public code takes the quantiles of its advantage from (an opt-in here; the paper tracks
    them across batches)."""
    rows = bundle_scores.to(torch.float64).view(-1, num_generations)
    # The levels on the scores' device: torch refuses a CPU ``q`` for CUDA scores.
    per_group = torch.nanquantile(rows, torch.as_tensor(levels, dtype=torch.float64, device=rows.device), dim=1).T
    return per_group.repeat_interleave(num_generations, dim=0)


def empirical_quantiles(scores: torch.Tensor, levels: torch.Tensor | list[float]) -> torch.Tensor:
    """Linear-interpolation empirical quantiles of the finite entries of ``scores`` (``NaN`` when there are none)."""
    levels_t = torch.as_tensor(levels, dtype=torch.float64)
    finite = scores[torch.isfinite(scores)].to(torch.float64).cpu()
    if finite.numel() == 0:
        return torch.full_like(levels_t, float("nan"))
    return torch.quantile(finite, levels_t)


def nanstd_rows(rows: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation (ddof=1) of each row's finite entries (0 where fewer than two)."""
    finite = torch.isfinite(rows)
    count = finite.sum(dim=1)
    values = torch.where(finite, rows, torch.zeros_like(rows))
    mean = values.sum(dim=1) / count.clamp(min=1)
    squares = torch.where(finite, (rows - mean.unsqueeze(1)) ** 2, torch.zeros_like(rows)).sum(dim=1)
    return torch.where(count > 1, (squares / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(mean))


@QUANTILE_SOURCES.register(
    "tracked", help="the paper: stochastic-approximation trackers updated once per generation batch"
)
def tracked_quantiles(
    bundle_scores: torch.Tensor, num_generations: int, levels: tuple[float, float], tracker: Any
) -> tuple[Quantile, Quantile]:
    if not tracker.initialized:  # evaluation before any training batch has no tracked quantiles yet: the batch's own
        return batch_quantiles(bundle_scores, num_generations, levels, tracker)
    q_alpha, q_beta = tracker.values.tolist()
    return q_alpha, q_beta


@QUANTILE_SOURCES.register("batch", help="empirical quantiles of the current batch's bundle scores")
def batch_quantiles(
    bundle_scores: torch.Tensor, num_generations: int, levels: tuple[float, float], tracker: Any
) -> tuple[Quantile, Quantile]:
    q_alpha, q_beta = empirical_quantiles(bundle_scores, list(levels)).tolist()
    return q_alpha, q_beta


@QUANTILE_SOURCES.register(
    "group", help="empirical quantiles within each bundle group, what the authors' public code does"
)
def per_group_quantiles(
    bundle_scores: torch.Tensor, num_generations: int, levels: tuple[float, float], tracker: Any
) -> tuple[Quantile, Quantile]:
    q_alpha, q_beta = group_quantiles(bundle_scores, num_generations, list(levels)).unbind(dim=1)
    return q_alpha, q_beta
