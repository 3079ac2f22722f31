"""Online quantile tracking by stochastic approximation (Algorithm 1, line 7 of the RiskPO paper)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import torch

from .quantiles import empirical_quantiles

MAX_FINITE_INT = int(sys.float_info.max)  # a larger JSON integer has no float
# Estimates of a checkpoint written before trackers saved the scores they saw: no reward of this package (0 to 1)
# or of TRL's examples comes near this, and a quantile of rewards cannot be farther out than the rewards.
LEGACY_ESTIMATE_BOUND = 1e6
MAX_UPDATES = 10**12  # batches: whatever the checkpoint's step allows, never more (and a product that stays a float)


class QuantileTracker:
    """Tracks quantiles of a stream of batches with one Robbins-Monro step per batch::

        q_k+1 = q_k + gamma_k * (level - mean_j 1{score_j < q_k})        (strict <)

    The fixed point is a ``q`` with a fraction ``level`` of the scores below it. The paper leaves ``q_0`` and
    ``gamma_k`` open; here the first batch warm-starts ``q`` at its empirical (linear) quantiles, and
    ``gamma_k = lr / k ** lr_decay`` for the ``k``-th step after that: ``lr_decay = 0`` is the constant step of the
    authors' code, a value in ``(0.5, 1]`` satisfies the classic conditions ``sum gamma = inf, sum gamma^2 < inf``.

    ``NaN`` scores are ignored; a batch with no finite score leaves the tracker untouched. Estimates stay ordered by
    level (a step that would cross two of them lifts the higher-level one). The tracker is training state: save
    :meth:`state_dict` with every checkpoint.

    Args:
        levels: quantile levels in ``[0, 1]``, e.g. ``(alpha, beta)``.
        lr: step size ``gamma`` in units of the score.
        lr_decay: exponent of the step-size decay; ``0`` keeps the step constant.
    """

    def __init__(self, levels: Sequence[float], lr: float = 0.1, lr_decay: float = 0.0) -> None:
        self.levels = torch.tensor([float(level) for level in levels], dtype=torch.float64)
        if self.levels.numel() == 0 or ((self.levels < 0) | (self.levels > 1)).any():
            raise ValueError(f"Quantile levels must be a non-empty sequence in [0, 1], got {list(levels)}.")
        if lr <= 0:
            raise ValueError(f"The tracker's lr must be positive, got {lr}.")
        if lr_decay < 0:
            raise ValueError(f"The tracker's lr_decay must be >= 0, got {lr_decay}.")
        self.lr = float(lr)
        self.lr_decay = float(lr_decay)
        self._values: torch.Tensor | None = None
        self.num_updates = 0  # batches seen, the warm start included
        self._score_range: tuple[float, float] | None = None  # lowest and highest finite score seen

    @property
    def initialized(self) -> bool:
        return self._values is not None

    @property
    def values(self) -> torch.Tensor:
        """Current estimates, one per level (float64). Raises if no batch has been seen yet."""
        if self._values is None:
            raise RuntimeError("The quantile tracker has not seen any scores yet; call update() first.")
        return self._values.clone()

    def step_size(self, step: int) -> float:
        """``gamma_k`` for the ``k``-th stochastic-approximation step (``k >= 1``)."""
        return self.lr / float(step) ** self.lr_decay

    def update(self, scores: torch.Tensor) -> torch.Tensor:
        """Take one step on a batch of scores and return the new estimates."""
        finite = scores.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
        finite = finite[torch.isfinite(finite)]
        if finite.numel() == 0:
            return self._values.clone() if self._values is not None else torch.full_like(self.levels, float("nan"))
        low, high = finite.min().item(), finite.max().item()
        if self._score_range is not None:
            low, high = min(low, self._score_range[0]), max(high, self._score_range[1])
        self._score_range = (low, high)
        if self._values is None:
            self._values = empirical_quantiles(finite, self.levels)
        else:
            frac_below = (finite.unsqueeze(0) < self._values.unsqueeze(1)).to(torch.float64).mean(dim=1)
            self._values = self._values + self.step_size(self.num_updates) * (self.levels - frac_below)
            self._values = self._keep_ordered(self._values)
        self.num_updates += 1
        return self._values.clone()

    def _keep_ordered(self, values: torch.Tensor) -> torch.Tensor:
        """Quantiles of higher levels never fall below those of lower levels. Separate SA steps can cross them when
        the scores barely vary; that would flip the sign of RVaR's window, so the higher one is lifted."""
        order = self.levels.argsort()
        ordered = values.clone()
        ordered[order] = torch.cummax(values[order], dim=0).values
        return ordered

    def state_dict(self) -> dict[str, Any]:
        return {
            "levels": self.levels.tolist(),
            "values": None if self._values is None else self._values.tolist(),
            "num_updates": self.num_updates,
            "score_range": None if self._score_range is None else list(self._score_range),
            "lr": self.lr,
            "lr_decay": self.lr_decay,
        }

    def load_state_dict(self, state: dict[str, Any], max_updates: int | None = None) -> None:
        """Restore :meth:`state_dict`'s output. Raises ValueError naming the field for a state that would train on
        wrong quantiles: levels other than this tracker's, estimates that are not one finite number per level in
        level order, an update count that is not a whole number (positive once there are estimates, at most
        ``max_updates``: what the checkpoint's step count allows), or estimates farther from the scores seen
        (``score_range``) than ``num_updates`` steps of at most ``lr`` can move them. Checkpoints written before
        ``score_range`` was saved are held to ``|estimate| <= LEGACY_ESTIMATE_BOUND``."""
        try:
            levels = [_finite(level, "levels") for level in state["levels"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"field 'levels' must be a list of numbers, got {_shown(state.get('levels'))}") from exc
        if levels != self.levels.tolist():
            raise ValueError(
                f"The saved tracker follows levels {levels}, this one {self.levels.tolist()}: resume with the same "
                "risk_alpha / risk_beta, or start a fresh run."
            )
        values, count = state.get("values"), state.get("num_updates")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_UPDATES:
            raise ValueError(
                f"field 'num_updates' must be a whole number from 0 to {MAX_UPDATES:.0e}, got {_shown(count)}"
            )
        if max_updates is not None and count > max_updates:
            raise ValueError(
                f"field 'num_updates' is {_shown(count)}, more than the {max_updates} training batches the "
                "checkpoint's step count allows"
            )
        if values is None:
            if count:
                raise ValueError(f"field 'values' is null after {count} updates")
            self._values, self.num_updates, self._score_range = None, 0, None
            return
        if not isinstance(values, list) or len(values) != len(levels):
            raise ValueError(
                f"field 'values' must be a list of {len(levels)} numbers (one per level), got {_shown(values)}"
            )
        restored = torch.tensor([_finite(value, "values") for value in values], dtype=torch.float64)
        if not torch.equal(self._keep_ordered(restored), restored):
            raise ValueError(f"field 'values' must not decrease with the level (levels {levels}), got {values!r}")
        if count < 1:
            raise ValueError(f"field 'num_updates' must be positive once there are estimates, got {count!r}")
        score_range = self._checked_score_range(state)
        reach = count * max(self.lr, self._saved_lr(state))  # no step moves an estimate farther than lr
        low, high = score_range if score_range is not None else (-LEGACY_ESTIMATE_BOUND, LEGACY_ESTIMATE_BOUND)
        if score_range is None:
            reach = 0.0
        slack = 1e-9 * (1.0 + abs(low) + abs(high) + reach)  # float rounding of the steps taken
        if restored.min().item() < low - reach - slack or restored.max().item() > high + reach + slack:
            raise ValueError(
                f"field 'values' {values!r} lies outside the scores seen ({low:g} to {high:g}) widened by what "
                f"{count} updates of at most lr={max(self.lr, self._saved_lr(state)):g} can move it"
            )
        self._values, self.num_updates, self._score_range = restored, count, score_range
        # lr and lr_decay stay as configured: a resumed run may deliberately change its schedule.

    @staticmethod
    def _checked_score_range(state: dict[str, Any]) -> tuple[float, float] | None:
        score_range = state.get("score_range")
        if score_range is None:
            return None
        if not isinstance(score_range, list) or len(score_range) != 2:
            raise ValueError(f"field 'score_range' must be [lowest, highest], got {_shown(score_range)}")
        low, high = (_finite(value, "score_range") for value in score_range)
        if max(abs(low), abs(high)) > LEGACY_ESTIMATE_BOUND:  # the file's own range must not widen its own bound
            raise ValueError(
                f"field 'score_range' {_shown(score_range)} lies beyond +-{LEGACY_ESTIMATE_BOUND:g}, the most any "
                "checkpoint's scores may reach"
            )
        if low > high:
            raise ValueError(f"field 'score_range' must be [lowest, highest], got {score_range!r}")
        return low, high

    @staticmethod
    def _saved_lr(state: dict[str, Any]) -> float:
        lr = _finite(state.get("lr", 0.0), "lr")
        if lr < 0:
            raise ValueError(f"field 'lr' must be >= 0, got {lr!r}")
        return lr

    def __repr__(self) -> str:
        values = None if self._values is None else [round(v, 4) for v in self._values.tolist()]
        return (
            f"QuantileTracker(levels={self.levels.tolist()}, values={values}, lr={self.lr}, "
            f"updates={self.num_updates})"
        )


def _finite(value: Any, field: str) -> float:
    """``value`` as a finite float: a JSON number (not a boolean), an integer bounded before its conversion."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"field {field!r} must hold numbers, got {_shown(value)}")
    if isinstance(value, int) and abs(value) > MAX_FINITE_INT:
        raise ValueError(f"field {field!r} holds {_shown(value)}, beyond any float")
    if not math.isfinite(value):
        raise ValueError(f"field {field!r} must be finite, got {value!r}")
    return float(value)


def _shown(value: Any) -> str:
    """``value`` for an error message, cut short (a 400-digit number or a long list would bury the message)."""
    text = (
        repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(value))} digits"
    )
    return text if len(text) <= 200 else text[:200] + "..."
