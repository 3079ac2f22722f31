"""RiskEstimator: the advantage step of RiskPO for one generation batch, with its state.

It owns what persists between batches (the quantile trackers) and the per-batch choices (how to bundle, where the
quantiles come from, which advantage variant and credit rule apply), so a trainer makes one call per batch::

    estimator = RiskEstimator.from_config(args)
    batch = estimator.step(rewards, generator=generator, train=True)   # -> RiskPOBatch

Pure math below it (the other modules of ``riskpo_trl.risk``), no trainer or TRL import: it can be driven by any loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from .batch import RiskPOBatch, apply_advantage_rule
from .choices import DEFAULT_CHOICES, RiskChoices
from .quantile_tracker import QuantileTracker
from .quantiles import tracked_quantiles


class RiskEstimator:
    """Algorithm 1, lines 6-8, for one generation batch at a time.

    ``step`` bundles the (gathered) rewards, takes one tracker step on the bundle scores when training, picks the
    quantiles (the function registered in :data:`QUANTILE_SOURCES` as ``quantile_source``: ``"tracked"`` the paper's
    trackers, ``"batch"`` the batch's empirical quantiles, ``"group"`` those of each bundle group as the authors' code)
    and returns every completion's advantage, minus the
    ``advantage_baseline`` (``"loo"``, the default: each prompt's leave-one-out mean; ``"none"``: the paper; unset
    with ``advantage_scaling="authors_code"`` it is ``"none"``, as their code). Evaluation
    batches never move the trackers, may end in a partial bundle group, and use the batch's own quantiles while the
    trackers have not seen a training batch yet.

    The trackers are training state: save :meth:`state_dict` with every checkpoint.
    """

    def __init__(
        self,
        *,
        num_generations: int,
        bundle_size: int,
        alpha: float,
        beta: float,
        omega: float,
        risk_profile: str = DEFAULT_CHOICES.risk_profile,
        quantile_source: str = DEFAULT_CHOICES.quantile_source,
        advantage_scaling: str = DEFAULT_CHOICES.advantage_scaling,
        natural_baseline: bool = DEFAULT_CHOICES.natural_baseline,
        credit_assignment: str = DEFAULT_CHOICES.credit_assignment,
        bundling: str = DEFAULT_CHOICES.bundling,
        quantile_lr: float = 0.1,
        quantile_lr_decay: float = 0.0,
        advantage_baseline: str | None = DEFAULT_CHOICES.advantage_baseline,
        risk_profile_parameters: Mapping[str, float] | None = None,
    ) -> None:
        self.num_generations = num_generations
        self.bundle_size = bundle_size
        self.levels = (float(alpha), float(beta))
        self.omega = omega
        # Every choice is resolved here, once, into the registered functions that step() calls.
        self.rule = RiskChoices(
            risk_profile=risk_profile,
            advantage_scaling=advantage_scaling,
            quantile_source=quantile_source,
            bundling=bundling,
            credit_assignment=credit_assignment,
            advantage_baseline=advantage_baseline,
            natural_baseline=natural_baseline,
            risk_profile_parameters=risk_profile_parameters,
        ).resolve(self.levels)
        self.tracker = QuantileTracker(self.levels, lr=quantile_lr, lr_decay=quantile_lr_decay)

    @classmethod
    def from_config(cls, args: Any) -> RiskEstimator:
        """Build from any object with ``RiskPOConfig``'s field names (a choice it lacks takes its default,
        :class:`~riskpo_trl.risk.choices.RiskChoices`)."""
        choices = RiskChoices.from_config(args)
        return cls(
            num_generations=args.num_generations,
            bundle_size=args.bundle_size,
            alpha=args.risk_alpha,
            beta=args.risk_beta,
            omega=args.risk_omega,
            quantile_lr=args.quantile_lr,
            quantile_lr_decay=args.quantile_lr_decay,
            **vars(choices),
        )

    @property
    def choices(self) -> RiskChoices:
        """The choices' names, ``advantage_baseline`` resolved."""
        return self.rule.choices

    def rechoose(self, **changes: Any) -> None:
        """Resolve the rule again with ``changes`` to its choices (e.g. the baseline a resumed checkpoint was trained
        with), keeping the trackers' state."""
        self.rule = replace(self.choices, **changes).resolve(self.levels)

    def step(
        self,
        rewards: torch.Tensor,
        *,
        generator: torch.Generator | None,
        train: bool,
        num_generations: int | None = None,
    ) -> RiskPOBatch:
        """Advantages of one generation batch.

        Args:
            rewards: the whole batch's rewards (gathered over processes), ``G`` consecutive per prompt, ``NaN`` where
                no reward function scored the completion.
            generator: the bundling's random source; seed it identically on every process.
            train: a training batch steps the trackers; an evaluation batch does not and may hold a partial group.
            num_generations: ``G`` of this batch when it differs from training's (TRL's ``num_generations_eval``).
        """
        num_generations = num_generations or self.num_generations
        bundles = self.rule.bundling(
            rewards, num_generations, self.bundle_size, generator, allow_partial_group=not train
        )
        if train:
            self.tracker.update(bundles[0])
        q_alpha, q_beta = self.rule.quantile_source(bundles[0], num_generations, self.levels, self.tracker)
        return apply_advantage_rule(
            self.rule,
            rewards,
            bundles,
            num_generations=num_generations,
            q_alpha=q_alpha,
            q_beta=q_beta,
            omega=self.omega,
            levels=self.levels,
        )

    def metrics(self, batch: RiskPOBatch) -> dict[str, float]:
        """``batch``'s ``risk/*`` metrics; when the advantages used other quantiles, also where the trackers are."""
        metrics = batch.metrics(self.omega)
        if self.rule.quantile_source is not tracked_quantiles and self.tracker.initialized:
            metrics["risk/tracked_q_alpha"], metrics["risk/tracked_q_beta"] = self.tracker.values.tolist()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"quantile_tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any], max_updates: int | None = None) -> None:
        """Restore :meth:`state_dict`'s output (``max_updates``: see `QuantileTracker.load_state_dict`)."""
        self.tracker.load_state_dict(state["quantile_tracker"], max_updates)

    def __repr__(self) -> str:
        choices = self.choices
        return (
            f"RiskEstimator(profile={choices.risk_profile!r}, scaling={choices.advantage_scaling!r}, "
            f"quantiles={choices.quantile_source!r}, baseline={choices.advantage_baseline!r}, B={self.bundle_size}, "
            f"G={self.num_generations}, {self.tracker!r})"
        )
