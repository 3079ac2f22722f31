"""Bundle advantages: one registry of risk profiles, each with its formulas and its objective.

A risk profile (the config's ``risk_profile``) is the paper's advantage formula for one risk measure, registered with
:func:`register_risk_profile` together with the batch estimate of its objective (logged as ``risk/<profile>``). An
advantage scaling (the config's ``advantage_scaling``, :data:`ADVANTAGE_SCALINGS`) is another way to compute a
profile's advantage, registered on that profile with :func:`register_scaled_advantage`: ``"none"`` is the paper's
formula, ``"authors_code"`` the authors' public code's. Adding a risk profile is one decorated function::

    @register_risk_profile("my_profile", objective=my_objective, help="what it optimises")
    def my_profile_advantage(scores, q_alpha, q_beta, omega, natural_baseline=True): ...

A formula takes the bundle scores, the two quantiles and ``omega``, and may ask, by naming them as keyword
parameters, for ``natural_baseline`` (then ``natural_baseline=False`` applies to it), ``alpha`` and ``beta`` (the
quantile levels) and ``num_generations``. A profile with a hyperparameter of its own declares it, and its formula
and objective take it by name; the config sets it with ``risk_profile_parameters={"eta": 2.0}``::

    @register_risk_profile("entropic", objective=entropic_objective, help="...",
                           parameters={"eta": ProfileParameter(1.0, "the risk aversion", lambda v: v > 0, "> 0")})
    def entropic_advantage(scores, q_alpha, q_beta, omega, eta): ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..registry import RegistrationError, Registry, Says, closest_names, undo_on_exit
from .metrics import mvar_objective, risk_seeking_objective, rvar_objective
from .quantiles import Quantile, as_tensor_like, nanstd_rows

AdvantageFn = Callable[..., torch.Tensor]
ObjectiveFn = Callable[[torch.Tensor, Quantile, Quantile, float], torch.Tensor]
CONTEXT_ARGUMENTS = ("alpha", "beta", "num_generations", "natural_baseline")


# The quantile levels' rules, each in one place: every formula needs them in order, the authors' scalings more.
def levels_in_order(alpha: float, beta: float) -> bool:
    return 0 <= alpha < beta <= 1


def _alpha_positive(alpha: float, beta: float) -> bool:
    return alpha > 0 and levels_in_order(alpha, beta)


def _beta_below_one(alpha: float, beta: float) -> bool:
    return beta < 1 and levels_in_order(alpha, beta)


@dataclass(frozen=True)
class ScaledAdvantage:
    """One way to compute a profile's bundle advantage: ``fn``, the quantile levels it allows (``levels_ok``; in words
    ``levels_rule``, for error messages) and the context arguments it asks for."""

    fn: AdvantageFn
    levels_ok: Callable[[float, float], bool] = levels_in_order
    levels_rule: str = "0 <= alpha < beta <= 1"

    @property
    def accepts(self) -> frozenset[str]:
        """Every parameter name of the formula: the context arguments it asks for and its profile's own."""
        return frozenset(inspect.signature(self.fn).parameters)

    @property
    def wants(self) -> frozenset[str]:
        return self.accepts & frozenset(CONTEXT_ARGUMENTS)

    @property
    def has_natural_baseline(self) -> bool:
        """The formula carries ``g``'s ``q_alpha - q_beta`` constant, so ``natural_baseline=False`` changes it."""
        return "natural_baseline" in self.wants

    @property
    def needs_levels(self) -> bool:
        return bool({"alpha", "beta"} & self.wants)

    def __call__(self, scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float, **context):
        accepts = self.accepts
        return self.fn(scores, q_alpha, q_beta, omega, **{k: v for k, v in context.items() if k in accepts})


@dataclass(frozen=True)
class AdvantageScaling:
    """One way to compute the risk profiles' advantages (the config's ``advantage_scaling``): the formula of each
    profile it is defined for, ``formulas[profile name]``. ``"none"`` holds the paper's formulas."""

    name: str
    formulas: dict[str, ScaledAdvantage] = field(default_factory=dict)

    def of(self, profile: str) -> ScaledAdvantage:
        """The formula for ``profile``, or a ``ValueError`` naming the profiles it is defined for."""
        if profile not in self.formulas:
            raise ValueError(
                f"advantage_scaling={self.name!r} is defined for risk_profile in {sorted(self.formulas)}, "
                f"not {profile!r}."
            )
        return self.formulas[profile]


ADVANTAGE_SCALINGS: Registry[AdvantageScaling] = Registry(
    "advantage_scaling",
    spec={
        "quantile_source": Says(
            str,
            "the quantile source the scaling needs (the config refuses another)",
            False,
            ("quantile_source_reason",),
        ),
        "quantile_source_reason": Says(
            str, "why it needs that quantile source, the end of the config's refusal", False, ("quantile_source",)
        ),
    },
    needs_help=True,
)
ADVANTAGE_SCALINGS.add("none", AdvantageScaling("none"), help="the paper's advantage")
ADVANTAGE_SCALINGS.add(
    "authors_code",
    AdvantageScaling("authors_code"),
    help="the authors' public code's scaling: for mvar [omega*(-(q_a-R)^+/alpha) + g/(beta-alpha)]/(1+omega) (needs "
    "risk_alpha > 0), for risk_seeking [omega*(R-q_b)^+/(1-beta) + g/(beta-alpha)]/(1+omega) (needs risk_beta < 1), "
    "each divided by the std of the bundle group's scores; their scripts use omega=1.5 with quantile_source='group'",
    # The config refuses this scaling with any other quantile source, for this reason.
    quantile_source="group",
    quantile_source_reason="divides by each bundle group's score std, which is only on a sensible scale with the "
    "group's own quantiles (with shared quantiles the failures of a group with one success get 2-3 times the "
    "advantage of an all-zero group). Set quantile_source='group' (what the authors' code effectively does), or "
    "advantage_scaling='none' for the paper's advantage.",
)


@dataclass(frozen=True)
class ProfileParameter:
    """A hyperparameter of one risk profile's own, beyond ``risk_alpha``, ``risk_beta`` and ``risk_omega`` (set with
    the config's ``risk_profile_parameters``): its default, what it means, and the values it allows (``allowed``; in
    words ``allowed_rule``)."""

    default: float
    help: str
    allowed: Callable[[float], bool] | None = None
    allowed_rule: str = ""


@dataclass(frozen=True)
class RiskProfile:
    """A registered risk profile: its ``objective`` (batch estimate, logged as ``risk/<name>``), its advantage under
    each advantage scaling that defines it (``"none"``: the paper's formula) and its own hyperparameters
    (``parameters``; formula and objective take each as a keyword argument). Calling it computes the paper's
    advantage, with the parameters' defaults unless given."""

    name: str
    objective: ObjectiveFn
    parameters: Mapping[str, ProfileParameter] = field(default_factory=dict)

    @property
    def defaults(self) -> dict[str, float]:
        return {name: parameter.default for name, parameter in self.parameters.items()}

    def parameter_values(self, given: Mapping[str, Any] | None) -> dict[str, float]:
        """Every parameter's value: ``given`` (the config's ``risk_profile_parameters``) over the defaults; a
        ``ValueError`` names an unknown parameter (with the closest one) or a value it does not allow."""
        given = dict(given or {})
        unknown = [name for name in given if name not in self.parameters]
        if unknown:
            takes = sorted(self.parameters) or "none"
            raise ValueError(
                f"risk_profile_parameters names {unknown}{closest_names(unknown, self.parameters)}, not parameters "
                f"of risk_profile={self.name!r}; it takes {takes}."
            )
        values = {**self.defaults, **given}
        for name, value in values.items():
            parameter = self.parameters[name]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or (parameter.allowed is not None and not parameter.allowed(value)):
                rule = f" ({parameter.allowed_rule})" if parameter.allowed_rule else ""
                raise ValueError(
                    f"risk_profile_parameters {name}={value!r} for risk_profile={self.name!r}: {name} is "
                    f"{parameter.help}, a number{rule}."
                )
        return {name: float(value) for name, value in values.items()}

    def estimate(self, scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float, **parameters):
        """The objective's batch estimate, with the profile's own parameters (their defaults unless given)."""
        return self.objective(scores, q_alpha, q_beta, omega, **{**self.defaults, **parameters})

    @property
    def scalings(self) -> dict[str, ScaledAdvantage]:
        """``{scaling name: formula}`` for every advantage scaling defined for this profile."""
        return {name: s.formulas[self.name] for name, s in ADVANTAGE_SCALINGS.items() if self.name in s.formulas}

    def advantage(self, scaling: str = "none") -> ScaledAdvantage:
        """The advantage under ``scaling``, or a ``ValueError`` naming the valid choices."""
        return ADVANTAGE_SCALINGS.get(scaling).of(self.name)

    @property
    def metric(self) -> str:
        return f"risk/{self.name}"

    def __call__(self, scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float, **context):
        return self.advantage("none")(scores, q_alpha, q_beta, omega, **{**self.defaults, **context})


# A registered profile is a RiskProfile (typed: its objective and its own parameters), so the entry says nothing more.
RISK_PROFILES: Registry[RiskProfile] = Registry("risk_profile", needs_help=True)
FORMULA_ARGUMENTS = ("scores", "q_alpha", "q_beta", "omega", *CONTEXT_ARGUMENTS)


def register_risk_profile(
    name: str,
    *,
    objective: ObjectiveFn,
    help: str,
    levels_ok: Callable[[float, float], bool] = levels_in_order,
    levels_rule: str = "0 <= alpha < beta <= 1",
    parameters: Mapping[str, ProfileParameter] | None = None,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register the paper's advantage formula of the risk profile ``name``, its ``objective`` and its own
    hyperparameters (``parameters``: each a keyword parameter of the formula and of the objective)."""

    def register(fn: AdvantageFn) -> AdvantageFn:
        profile = RiskProfile(name, objective, dict(parameters or {}))
        _check_profile_parameters(profile, fn)
        RISK_PROFILES.add(name, profile, help)
        _add_formula("none", name, ScaledAdvantage(fn, levels_ok, levels_rule))
        return fn

    return register


def _check_profile_parameters(profile: RiskProfile, fn: AdvantageFn) -> None:
    """Raise `RegistrationError` unless each of the profile's own parameters is a new name that its formula and its
    objective take, with a default it allows."""
    for name, parameter in profile.parameters.items():
        where = f"risk_profile {profile.name!r} is registered with the parameter {name!r}"
        if not isinstance(parameter, ProfileParameter):
            raise RegistrationError(f"{where} as {parameter!r}; give a ProfileParameter(default, help).")
        if name in FORMULA_ARGUMENTS:
            raise RegistrationError(f"{where}, which every formula already gets; give it another name.")
        for what, function in (("formula", fn), ("objective", profile.objective)):
            if name not in inspect.signature(function).parameters:
                raise RegistrationError(f"{where}, which its {what} {function.__name__} does not take; add {name}=.")
        if parameter.allowed is not None and not parameter.allowed(parameter.default):
            raise RegistrationError(f"{where}, whose default {parameter.default} it does not allow.")


def _add_formula(scaling: str, profile: str, formula: ScaledAdvantage) -> None:
    """``profile``'s formula under ``scaling``; removed again when a `temporary_entries` block ends."""
    formulas = ADVANTAGE_SCALINGS.get(scaling).formulas
    formulas[profile] = formula
    undo_on_exit(lambda: formulas.pop(profile, None) if formulas.get(profile) is formula else None)


def register_scaled_advantage(
    scaling: str, profile: str, *, levels_ok: Callable[[float, float], bool], levels_rule: str
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register the decorated formula as ``profile``'s advantage under the advantage scaling ``scaling``."""

    def register(fn: AdvantageFn) -> AdvantageFn:
        RISK_PROFILES.check(profile)
        _add_formula(scaling, profile, ScaledAdvantage(fn, levels_ok, levels_rule))
        return fn

    return register


def scaled_advantage(advantage_scaling: str, risk_profile: str) -> ScaledAdvantage:
    """The registered advantage for a scaling and profile, or a ``ValueError`` naming the valid choices."""
    return RISK_PROFILES.get(risk_profile).advantage(advantage_scaling)


# --- the paper's formulas


def rvar_window(
    scores: torch.Tensor, q_low: Quantile, q_high: Quantile, natural_baseline: bool = True
) -> torch.Tensor:
    """``g(z, a, b) = (z - a)^+ - (z - b)^+ + a - b`` of Theorem 1: the score-function weight of
    ``(b_level - a_level) * RVaR_{a_level:b_level}``. It is ``a - b`` below ``a``, rises linearly in ``[a, b]`` and is
    ``0`` above ``b``. ``natural_baseline=False`` drops the constant ``a - b`` (then ``0`` below ``a`` and ``b - a``
    above ``b``), as the authors' DAPO script does."""
    a, b = as_tensor_like(q_low, scores), as_tensor_like(q_high, scores)
    # min(max(z, a), b) - b equals (z - a)^+ - (z - b)^+ + a - b for a <= b, and is exactly 0 above b in floating
    # point (the sum of the four terms leaves rounding residue of ~1e-17 there, so "zero advantage" would not be zero).
    clipped = torch.minimum(torch.maximum(scores, a), b)
    return clipped - b if natural_baseline else clipped - a


@register_risk_profile(
    "mvar",
    objective=mvar_objective,
    help="the paper's Mixed VaR, risk-averse: the lower tail weighted by 1 + risk_omega",
)
def mvar_advantage(
    scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float, natural_baseline: bool = True
) -> torch.Tensor:
    """Bundle advantage of the MVaR objective (paper, eq. for ``A_j``)::

        A = -(1 + omega) * (q_alpha - R_B)^+ + g(R_B, q_alpha, q_beta)

    Its expectation against ``grad log pi`` is the gradient of
    ``J = (1 + omega) * alpha * RVaR_{0:alpha} + (beta - alpha) * RVaR_{alpha:beta}`` (eq. ``mvar`` with Theorem 1).
    ``A <= 0`` everywhere, ``A = 0`` above ``q_beta`` (the upper tail is excluded), the slope is ``1`` between the
    quantiles and ``1 + omega`` below ``q_alpha``. ``omega = 0`` gives ``CVaR_beta = RVaR_{0:beta}``,
    ``-(q_beta - R_B)^+``. ``natural_baseline=False`` drops ``g``'s constant ``q_alpha - q_beta`` (see
    :func:`rvar_window`).
    """
    lower_tail = (as_tensor_like(q_alpha, scores) - scores).clamp(min=0)
    return -(1.0 + omega) * lower_tail + rvar_window(scores, q_alpha, q_beta, natural_baseline)


@register_risk_profile(
    "rvar", objective=rvar_objective, help="RVaR between the alpha and beta quantiles alone; risk_alpha=0 gives CVaR"
)
def rvar_advantage(
    scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float = 0.0, natural_baseline: bool = True
) -> torch.Tensor:
    """Bundle advantage of ``(beta - alpha) * RVaR_{alpha:beta}`` alone: ``g(R_B, q_alpha, q_beta)`` (Theorem 1).

    Both tails are excluded from the gradient; ``alpha = 0`` gives ``CVaR_beta``. ``omega`` is accepted for a uniform
    signature and ignored.
    """
    del omega
    return rvar_window(scores, q_alpha, q_beta, natural_baseline)


@register_risk_profile(
    "risk_seeking", objective=risk_seeking_objective, help="the paper's ablation weighting the upper tail"
)
def risk_seeking_advantage(scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float) -> torch.Tensor:
    """Bundle advantage of the paper's risk-seeking ablation,
    ``J = (1 + omega) * (1 - beta) * RVaR_{beta:1} + (beta - alpha) * RVaR_{alpha:beta}``::

        A = (1 + omega) * (R_B - q_beta)^+ + (R_B - q_alpha)^+ - (R_B - q_beta)^+

    Theorem 1 gives the weight up to a constant (``g(R_B, q_beta, q_1)`` carries ``q_beta - q_1``); a constant leaves
    the expected gradient unchanged, and it is chosen so that the excluded lower tail gets ``A = 0``, mirroring MVaR,
    whose excluded upper tail gets ``A = 0``. Hence ``A >= 0`` everywhere.
    """
    upper_tail = (scores - as_tensor_like(q_beta, scores)).clamp(min=0)
    return (1.0 + omega) * upper_tail + rvar_window(scores, q_alpha, q_beta, natural_baseline=False)


# --- the authors' code's scaling (quantile levels in the denominators, then the group std)


def _divide_by_group_std(advantage: torch.Tensor, scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The authors' code's last step: divide by the std (ddof=1) of the bundle group's ``G`` bundle scores. A group
    whose scores are all equal keeps the unscaled value (with group quantiles it is 0 there anyway)."""
    std = nanstd_rows(scores.view(-1, num_generations)).repeat_interleave(num_generations)
    return advantage / torch.where(std > 0, std, torch.ones_like(std))


@register_scaled_advantage(
    "authors_code",
    "mvar",
    levels_ok=_alpha_positive,
    levels_rule="risk_alpha > 0 (it divides by alpha)",
)
def authors_code_mvar_advantage(
    scores: torch.Tensor,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    *,
    alpha: float,
    beta: float,
    num_generations: int,
    natural_baseline: bool = True,
) -> torch.Tensor:
    """The MVaR advantage as the authors' public code scales it (an opt-in; the paper's is :func:`mvar_advantage`)::

        A = [omega * (-(q_alpha - R_B)^+ / alpha) + g(R_B, q_alpha, q_beta) / (beta - alpha)] / (1 + omega)

    i.e. the score-function weight of ``[omega * RVaR_{0:alpha} + RVaR_{alpha:beta}] / (1 + omega)``, then divided by
    the standard deviation of the bundle scores of its bundle group (``num_generations`` consecutive bundles). A group
    whose scores are all equal keeps the unscaled value rather than being divided by ~0. That code calls ``omega``
    ``w_mix`` and uses 1.5. Below ``q_alpha`` the slope is ``omega * (beta - alpha) / alpha`` times the window's
    (the paper's is ``1 + omega``): 4.5 at alpha = 0.2, beta = 0.8, i.e. the paper's shape with an effective omega of
    3.5 (4.25 at beta = 0.9), up to a positive factor. ``natural_baseline=False`` drops ``g``'s constant (the
    authors' ``natural_baseline_adv=False``).
    """
    if not _alpha_positive(alpha, beta):
        raise ValueError(
            f"The authors' MVaR scaling divides by alpha and beta - alpha; got alpha={alpha}, beta={beta}."
        )
    lower_tail = -(as_tensor_like(q_alpha, scores) - scores).clamp(min=0) / alpha
    window = rvar_window(scores, q_alpha, q_beta, natural_baseline) / (beta - alpha)
    return _divide_by_group_std((omega * lower_tail + window) / (1.0 + omega), scores, num_generations)


@register_scaled_advantage(
    "authors_code",
    "risk_seeking",
    levels_ok=_beta_below_one,
    levels_rule="risk_beta < 1 (it divides by 1 - beta)",
)
def authors_code_risk_seeking_advantage(
    scores: torch.Tensor,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    *,
    alpha: float,
    beta: float,
    num_generations: int,
    natural_baseline: bool = True,
) -> torch.Tensor:
    """The risk-seeking advantage as the authors' public code scales it (their risky MATH script)::

        A = [omega * (R_B - q_beta)^+ / (1 - beta) + g(R_B, q_alpha, q_beta) / (beta - alpha)] / (1 + omega)

    then divided by the bundle group's score std, as :func:`authors_code_mvar_advantage`. That code calls ``omega``
    ``upper_weight`` and uses 1.5. Unlike the paper's form (:func:`risk_seeking_advantage`) the lower tail keeps
    ``g``'s negative constant unless ``natural_baseline=False``.
    """
    if not _beta_below_one(alpha, beta):
        raise ValueError(
            f"The authors' risk-seeking scaling divides by 1 - beta and beta - alpha; got alpha={alpha}, beta={beta}."
        )
    upper_tail = (scores - as_tensor_like(q_beta, scores)).clamp(min=0) / (1.0 - beta)
    window = rvar_window(scores, q_alpha, q_beta, natural_baseline) / (beta - alpha)
    return _divide_by_group_std((omega * upper_tail + window) / (1.0 + omega), scores, num_generations)
