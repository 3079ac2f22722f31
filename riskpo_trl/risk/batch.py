"""One generation batch's advantage step (Algorithm 1, lines 6 and 8) and what it produces, :class:`RiskPOBatch`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .advantages import RiskProfile
from .bundling import Bundles
from .choices import DEFAULT_CHOICES, AdvantageRule, RiskChoices
from .metrics import ZERO_ADVANTAGE_TOLERANCE, frac_prompts_all_failed, push_signals
from .quantiles import Quantile, as_tensor_like


@dataclass
class RiskPOBatch:
    """What one generation batch's risk step produced; every tensor covers the whole (gathered) batch."""

    advantages: torch.Tensor  # one per completion; never NaN
    bundle_ids: torch.Tensor  # one per completion
    bundle_scores: torch.Tensor  # one per bundle; NaN for a bundle without a scorable member
    q_alpha: float | torch.Tensor  # one value, or one per bundle (quantiles taken per bundle group)
    q_beta: float | torch.Tensor
    profile: RiskProfile  # whose objective the metrics estimate
    unscorable: torch.Tensor | None = None  # one bool per completion: no reward function scored it
    rewards: torch.Tensor | None = None  # one per completion, NaN where unscorable
    num_generations: int | None = None  # completions per prompt (G), for the per-prompt metrics
    profile_parameters: dict[str, float] | None = None  # the profile's own hyperparameters (None: their defaults)

    @property
    def risk_profile(self) -> str:
        return self.profile.name

    def metrics(self, omega: float) -> dict[str, float]:
        """The per-batch ``risk/*`` metrics the trainer logs (per-bundle quantiles are logged as their mean), with the
        risk profile's own objective as ``risk/<profile>`` (``risk/mvar`` for MVaR).

        ``risk/lower_rvar`` / ``risk/upper_rvar`` are left out when no bundle of the batch lies in that tail (e.g. no
        bundle ever scores above ``q_beta`` when ``beta = 1`` or when the top bundles tie at ``q_beta``): an empty
        mean is not a value."""
        scores = self.bundle_scores
        profile = self.profile
        finite = torch.isfinite(scores)
        q_alpha, q_beta = as_tensor_like(self.q_alpha, scores), as_tensor_like(self.q_beta, scores)
        lower = scores[finite & (scores <= q_alpha)]
        upper = scores[finite & (scores > q_beta)]
        finite_scores = scores[finite]
        nan = float("nan")
        unscorable = self.unscorable if self.unscorable is not None else torch.zeros_like(self.advantages, dtype=bool)
        metrics = {
            "risk/q_alpha": q_alpha.float().mean().item(),
            "risk/q_beta": q_beta.float().mean().item(),
            "risk/bundle_score_mean": finite_scores.mean().item() if finite_scores.numel() else nan,
            "risk/bundle_score_std": finite_scores.std().item() if finite_scores.numel() > 1 else nan,
            profile.metric: profile.estimate(
                self.bundle_scores, self.q_alpha, self.q_beta, omega, **(self.profile_parameters or {})
            ).item(),
            "risk/frac_zero_advantage": (self.advantages.abs() <= ZERO_ADVANTAGE_TOLERANCE).float().mean().item(),
            "risk/frac_unscorable": unscorable.float().mean().item() if unscorable.numel() else 0.0,
            "risk/advantage_mean": self.advantages.mean().item(),
        }
        if lower.numel():
            metrics["risk/lower_rvar"] = lower.mean().item()
        if upper.numel():
            metrics["risk/upper_rvar"] = upper.mean().item()
        metrics.update(self.push_metrics())
        return metrics

    def push_metrics(self) -> dict[str, float]:
        """:func:`push_signals` over the scorable completions and :func:`frac_prompts_all_failed`, as ``risk/*``
        metrics. The second is what the regime guard watches (see ``RiskPOConfig.regime_guard_threshold``)."""
        scorable = ~self.unscorable if self.unscorable is not None else torch.ones_like(self.advantages, dtype=bool)
        if not scorable.any():
            return {}
        rewards = self.rewards[scorable] if self.rewards is not None else None
        metrics = {f"risk/{name}": value for name, value in push_signals(self.advantages[scorable], rewards).items()}
        if self.rewards is not None and self.num_generations:
            failed = frac_prompts_all_failed(self.rewards, self.num_generations)
            if failed is not None:
                metrics["risk/frac_prompts_all_failed"] = failed
        return metrics


def riskpo_advantages(
    rewards: torch.Tensor,
    *,
    num_generations: int,
    bundle_size: int | None = None,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    risk_profile: str = DEFAULT_CHOICES.risk_profile,
    bundles: Bundles | None = None,
    generator: torch.Generator | None = None,
    advantage_scaling: str = DEFAULT_CHOICES.advantage_scaling,
    levels: tuple[float, float] | None = None,
    natural_baseline: bool = DEFAULT_CHOICES.natural_baseline,
    credit_assignment: str = DEFAULT_CHOICES.credit_assignment,
    bundling: str = DEFAULT_CHOICES.bundling,
    advantage_baseline: str | None = DEFAULT_CHOICES.advantage_baseline,
    risk_profile_parameters: Mapping[str, float] | None = None,
) -> RiskPOBatch:
    """Bundle a batch, score it against the given quantiles and spread each bundle's advantage to its members: the
    choices named (:class:`~riskpo_trl.risk.choices.RiskChoices`) resolved for this one call, then
    :func:`apply_advantage_rule`. A loop over batches resolves once and calls that instead, as
    :class:`~riskpo_trl.risk.estimator.RiskEstimator` does.

    This is lines 6 and 8 of Algorithm 1 without the tracker update (line 7), which the caller does in between so the
    quantiles can come from a tracker, from the batch itself, or from anywhere else
    (:class:`~riskpo_trl.risk.estimator.RiskEstimator` does all three for the trainer).

    Args:
        rewards: ``P * G`` rewards, ``NaN`` for an unscorable completion.
        num_generations, bundle_size: ``G`` and ``B`` (``B`` only to draw ``bundles``).
        q_alpha, q_beta: the quantiles; floats, 0-d tensors or one value per bundle.
        omega: the tail weight (``w_mix`` / ``upper_weight`` in the authors' scaling).
        risk_profile, advantage_scaling: pick the formula (:data:`RISK_PROFILES`); ``"authors_code"`` needs
            ``levels=(alpha, beta)``.
        bundles: a bundling to reuse (``(scores, ids)`` from :data:`BUNDLINGS`); without it one is drawn with the
            ``bundling`` rule from ``generator``.
        natural_baseline: keep ``g``'s ``q_alpha - q_beta`` constant (the paper); ``False`` drops it.
        credit_assignment: a key of :data:`CREDIT_ASSIGNMENTS`; ``"uniform"`` (the paper) gives every member its
            bundle's advantage.
        advantage_baseline: a key of :data:`ADVANTAGE_BASELINES`, subtracted last; ``"loo"`` (the default) each
            prompt's leave-one-out mean, ``"none"`` (the paper) nothing. Unset with
            ``advantage_scaling="authors_code"`` it is ``"none"``
            (:func:`~riskpo_trl.risk.defaults.resolve_advantage_baseline`).
        risk_profile_parameters: the profile's own hyperparameters by name; those left out take their defaults.
    """
    choices = RiskChoices(
        risk_profile=risk_profile,
        advantage_scaling=advantage_scaling,
        bundling=bundling,
        credit_assignment=credit_assignment,
        advantage_baseline=advantage_baseline,
        natural_baseline=natural_baseline,
        risk_profile_parameters=risk_profile_parameters,
    )
    rule = choices.resolve(levels)
    if bundles is None:
        if bundle_size is None:
            raise ValueError("riskpo_advantages needs bundle_size to draw the bundles (or pass bundles=).")
        bundles = rule.bundling(rewards, num_generations, bundle_size, generator)
    return apply_advantage_rule(
        rule,
        rewards,
        bundles,
        num_generations=num_generations,
        q_alpha=q_alpha,
        q_beta=q_beta,
        omega=omega,
        levels=levels,
    )


def apply_advantage_rule(
    rule: AdvantageRule,
    rewards: torch.Tensor,
    bundles: Bundles,
    *,
    num_generations: int,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    levels: tuple[float, float] | None,
) -> RiskPOBatch:
    """Score the ``bundles`` of a batch against the quantiles and spread each bundle's advantage to its members, with
    the behaviour ``rule`` resolved once (:meth:`~riskpo_trl.risk.choices.RiskChoices.resolve`).

    Unscorable completions (``NaN`` reward) get advantage ``0``; so do all members of a bundle that has no scorable
    member. Every other completion gets its (credited) bundle advantage, minus the baseline, so the result is never
    ``NaN``.
    """
    if rule.advantage.needs_levels and levels is None:
        raise ValueError(
            f"advantage_scaling={rule.choices.advantage_scaling!r} needs the quantile levels: pass "
            "levels=(alpha, beta)."
        )
    alpha, beta = levels if levels is not None else (None, None)
    bundle_scores, bundle_ids = bundles
    bundle_adv = rule.advantage(
        bundle_scores.to(torch.float64),
        q_alpha,
        q_beta,
        omega,
        alpha=alpha,
        beta=beta,
        num_generations=num_generations,
        natural_baseline=rule.choices.natural_baseline,
        **rule.profile_parameters,
    )
    advantages = rule.credit(bundle_adv[bundle_ids], rewards, bundle_ids, num_generations)
    unscorable = torch.isnan(rewards)
    advantages = torch.where(unscorable, torch.zeros_like(advantages), advantages)
    advantages = torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0)
    advantages = rule.baseline(advantages, ~unscorable, num_generations).to(torch.float32)
    return RiskPOBatch(
        advantages=advantages,
        bundle_ids=bundle_ids,
        bundle_scores=bundle_scores,
        q_alpha=_as_float_or_tensor(q_alpha),
        q_beta=_as_float_or_tensor(q_beta),
        profile=rule.profile,
        unscorable=unscorable,
        rewards=rewards,
        num_generations=num_generations,
        profile_parameters=rule.profile_parameters,
    )


def _as_float_or_tensor(value: Quantile) -> float | torch.Tensor:
    return float(value) if not isinstance(value, torch.Tensor) or value.numel() == 1 else value
