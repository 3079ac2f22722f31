"""The public per-batch seam: every generation batch a GRPO-family trainer scores reaches its batch observers.

An observer is any callable taking one :class:`ScoredBatch`; register it with ``trainer.add_batch_observer(fn)``.
It sees the whole (gathered) batch's rewards, this process's tensors that reach the loss, and, for RiskPO, the
:class:`~riskpo_trl.risk.RiskPOBatch` (bundles, advantages, quantiles) with the ``risk/*`` metrics logged for it.
The regime guard, the tests, the benchmarks and the studies observe batches this way rather than by overriding TRL's
private methods; ``BatchObserversMixin`` is the one place that overrides ``_generate_and_score_completions`` and
``_calculate_rewards`` (which keeps the batch's gathered rewards for it; the job layer's reward accounting names the
reward functions that returned None or NaN, for any trainer). It is RiskPOTrainer's; the recipes' GRPO and GMPO
baselines are TRL's own classes, without it. A study that observes a TRL trainer's batches builds it with
``riskpo_trl.trainer.observed.observed_trainer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import compat
from ..risk import RiskPOBatch


@dataclass
class ScoredBatch:
    """One scored generation batch, as observers see it."""

    trainer: Any
    mode: str  # "train" or "eval"
    rewards_per_func: torch.Tensor  # (completions, reward functions), gathered over all processes; NaN: unscored
    outputs: dict[str, Any]  # this process's batch as it goes to the loss (advantages, completion_mask, ...)
    risk: RiskPOBatch | None = None  # the advantage step's result (None for a baseline trainer)
    metrics: dict[str, float] = field(default_factory=dict)  # the risk/* metrics logged for the batch

    @property
    def rewards(self) -> torch.Tensor:
        """Each completion's weighted reward (NaN where no reward function scored it), gathered."""
        if self.risk is not None and self.risk.rewards is not None:
            return self.risk.rewards
        weights = self.trainer.reward_weights.to(self.rewards_per_func.device).unsqueeze(0)
        rewards = (self.rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(self.rewards_per_func).all(dim=1)] = torch.nan
        return rewards


BatchObserver = Callable[[ScoredBatch], None]


class BatchObserversMixin:
    """For a `GRPOTrainer`: :meth:`add_batch_observer`, and every scored generation batch (training and evaluation)
    passed to the observers in the order they were added. A subclass computes its own advantages in
    :meth:`_score_batch`, which runs before the observers (the default changes nothing). ``_scored_rewards`` (the
    batch's gathered rewards per function) is set by :meth:`_calculate_rewards`."""

    _batch_observers: list[BatchObserver]
    _scored_rewards: torch.Tensor | None = None

    def add_batch_observer(self, observer: BatchObserver) -> None:
        if not hasattr(self, "_batch_observers"):
            self._batch_observers = []
        self._batch_observers.append(observer)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        outputs = super()._generate_and_score_completions(inputs)
        batch = ScoredBatch(self, "train" if self.model.training else "eval", self._scored_rewards, outputs)
        self._score_batch(batch)
        for observer in getattr(self, "_batch_observers", ()):
            observer(batch)
        return outputs

    def _score_batch(self, batch: ScoredBatch) -> None:
        """Hook for a subclass's advantage step: may replace ``batch.outputs["advantages"]`` and fill ``batch.risk``
        and ``batch.metrics``."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # The gathered rewards are kept for the batch's advantage step and its observers.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        compat.check_gathered_rewards(len(rewards_per_func), len(prompts), self.accelerator.num_processes)
        self._scored_rewards = rewards_per_func
        return rewards_per_func
