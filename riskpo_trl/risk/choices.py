"""The named choices of the advantage step, their defaults, and their one resolution into behaviour.

A config names its choices (``risk_profile``, ``advantage_scaling``, ``quantile_source``, ``bundling``,
``credit_assignment``, ``advantage_baseline``) and sets the profile's own hyperparameters
(``risk_profile_parameters``); :class:`RiskChoices` holds those names with their defaults, written
here only. :meth:`RiskChoices.resolve` checks them, and the pairs they form, once, and returns an
:class:`AdvantageRule`: the registered functions themselves. The estimator resolves its choices when it is built, so
no name is looked up per batch; the config resolves them when it is built, only to check them. This module is the
one place that maps a choice's name to its behaviour (a test keeps the lookups here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .advantages import RISK_PROFILES, RiskProfile, ScaledAdvantage, levels_in_order
from .baselines import ADVANTAGE_BASELINES, BaselineFn, check_baseline_pair
from .bundling import BUNDLINGS, BundlingFn
from .credit import CREDIT_ASSIGNMENTS, CreditFn
from .defaults import resolve_advantage_baseline
from .quantiles import QUANTILE_SOURCES, QuantileSource


@dataclass(frozen=True)
class AdvantageRule:
    """The behaviour a :class:`RiskChoices` names, resolved once: call these, never look a name up again."""

    choices: RiskChoices  # the names, ``advantage_baseline`` resolved
    profile: RiskProfile
    profile_parameters: dict[str, float]  # the profile's own hyperparameters, every one with its value
    advantage: ScaledAdvantage
    quantile_source: QuantileSource
    bundling: BundlingFn
    credit: CreditFn
    baseline: BaselineFn


@dataclass(frozen=True)
class RiskChoices:
    """The advantage step's named choices. The defaults are the paper's, except ``advantage_baseline``: unset, it
    resolves to ``"loo"``, or to ``"none"`` with ``advantage_scaling="authors_code"``
    (:func:`~riskpo_trl.risk.defaults.resolve_advantage_baseline`)."""

    risk_profile: str = "mvar"
    advantage_scaling: str = "none"
    quantile_source: str = "tracked"
    bundling: str = "permutation"
    credit_assignment: str = "uniform"
    advantage_baseline: str | None = None
    natural_baseline: bool = True
    risk_profile_parameters: Mapping[str, float] | None = (
        None  # the profile's own hyperparameters set; unset: defaults
    )

    @classmethod
    def from_config(cls, args: Any) -> RiskChoices:
        """The choices of any object with ``RiskPOConfig``'s field names; a field it lacks takes its default."""
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})

    def resolve(self, levels: tuple[float, float] | None = None) -> AdvantageRule:
        """Check every name and the pairs they form, and return their behaviour. With ``levels`` (``risk_alpha``,
        ``risk_beta``), also check that the chosen advantage allows them."""
        profile = RISK_PROFILES.get(self.risk_profile)
        profile_parameters = profile.parameter_values(self.risk_profile_parameters)
        quantile_source = QUANTILE_SOURCES.get(self.quantile_source)
        advantage = profile.advantage(self.advantage_scaling)
        credit = CREDIT_ASSIGNMENTS.get(self.credit_assignment)
        bundling = BUNDLINGS.get(self.bundling)
        baseline_name = resolve_advantage_baseline(self.advantage_baseline, self.advantage_scaling)
        baseline = ADVANTAGE_BASELINES.get(baseline_name)
        check_baseline_pair(baseline_name, self.advantage_scaling)
        if levels is not None:
            alpha, beta = levels
            if not levels_in_order(alpha, beta):
                raise ValueError(
                    f"risk_alpha={alpha} and risk_beta={beta} must satisfy 0 <= risk_alpha < risk_beta <= 1 (the "
                    "paper uses risk_alpha=0.2, risk_beta=0.8)."
                )
            if not advantage.levels_ok(alpha, beta):
                raise ValueError(
                    f"advantage_scaling={self.advantage_scaling!r} with risk_profile={self.risk_profile!r} needs "
                    f"{advantage.levels_rule}; got risk_alpha={alpha}, risk_beta={beta}."
                )
        if not self.natural_baseline and not advantage.has_natural_baseline:
            raise ValueError(
                f"natural_baseline=False changes nothing for risk_profile={self.risk_profile!r} with "
                f"advantage_scaling={self.advantage_scaling!r}: that advantage has no q_alpha - q_beta constant (its "
                "excluded lower tail already gets 0). Leave natural_baseline at True."
            )
        return AdvantageRule(
            choices=RiskChoices(**{**asdict(self), "advantage_baseline": baseline_name}),
            profile=profile,
            profile_parameters=profile_parameters,
            advantage=advantage,
            quantile_source=quantile_source,
            bundling=bundling,
            credit=credit,
            baseline=baseline,
        )


DEFAULT_CHOICES = RiskChoices()
