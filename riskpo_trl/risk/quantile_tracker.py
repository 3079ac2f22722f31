"""Online quantile tracking by stochastic approximation (Algorithm 1, line 7 of the RiskPO paper)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .quantiles import empirical_quantiles


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
            "lr": self.lr,
            "lr_decay": self.lr_decay,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. Raises ValueError naming the field for a state that would train on
        wrong quantiles: levels other than this tracker's, estimates that are not one finite number per level in
        level order, or an update count that is not a whole number (positive once there are estimates)."""
        try:
            levels = [float(level) for level in state["levels"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"field 'levels' must be a list of numbers, got {state.get('levels')!r}") from exc
        if levels != self.levels.tolist():
            raise ValueError(
                f"The saved tracker follows levels {levels}, this one {self.levels.tolist()}: resume with the same "
                "risk_alpha / risk_beta, or start a fresh run."
            )
        values, count = state.get("values"), state.get("num_updates")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"field 'num_updates' must be a whole number >= 0, got {count!r}")
        if values is None:
            if count:
                raise ValueError(f"field 'values' is null after {count} updates")
            self._values, self.num_updates = None, 0
            return
        if (
            not isinstance(values, list)
            or len(values) != len(levels)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        ):
            raise ValueError(f"field 'values' must be a list of {len(levels)} numbers (one per level), got {values!r}")
        restored = torch.tensor(values, dtype=torch.float64)
        if not torch.isfinite(restored).all():
            raise ValueError(f"field 'values' must be finite, got {values!r}")
        if not torch.equal(self._keep_ordered(restored), restored):
            raise ValueError(f"field 'values' must not decrease with the level (levels {levels}), got {values!r}")
        if count < 1:
            raise ValueError(f"field 'num_updates' must be positive once there are estimates, got {count!r}")
        self._values, self.num_updates = restored, count
        # lr and lr_decay stay as configured: a resumed run may deliberately change its schedule.

    def __repr__(self) -> str:
        values = None if self._values is None else [round(v, 4) for v in self._values.tolist()]
        return (
            f"QuantileTracker(levels={self.levels.tolist()}, values={values}, lr={self.lr}, "
            f"updates={self.num_updates})"
        )
