"""The risk math of RiskPO, pure functions of tensors (no trainer, no TRL): section 4 and Algorithm 1 of *RiskPO:
Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training* (Ren et al., 2025).

One module per job: ``bundling`` (matching completions into bundles), ``advantages`` (the risk profiles' formulas),
``credit`` (a bundle's advantage to its members), ``baselines`` (a control variate subtracted last), ``quantiles`` and
``quantile_tracker`` (where the quantiles come from), ``choices`` (the named choices, resolved once into these
functions), ``metrics`` (per-batch signals and objectives), ``batch`` (one
batch's step, :class:`RiskPOBatch`) and ``estimator`` (:class:`RiskEstimator`, the step with its state across batches).
Every choice is a registry filled by a decorator (:data:`BUNDLINGS`, :data:`RISK_PROFILES` with
:data:`ADVANTAGE_SCALINGS`, :data:`CREDIT_ASSIGNMENTS`, :data:`ADVANTAGE_BASELINES`, :data:`QUANTILE_SOURCES`).
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use (the advantage-baseline default without torch). The
# TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "advantages": (
        "ADVANTAGE_SCALINGS",
        "RISK_PROFILES",
        "AdvantageScaling",
        "ProfileParameter",
        "RiskProfile",
        "ScaledAdvantage",
        "authors_code_mvar_advantage",
        "authors_code_risk_seeking_advantage",
        "mvar_advantage",
        "register_risk_profile",
        "register_scaled_advantage",
        "risk_seeking_advantage",
        "rvar_advantage",
        "rvar_window",
        "scaled_advantage",
    ),
    "baselines": (
        "ADVANTAGE_BASELINES",
        "leave_one_out_baseline",
        "no_baseline",
    ),
    "batch": (
        "RiskPOBatch",
        "apply_advantage_rule",
        "riskpo_advantages",
    ),
    "bundling": (
        "BUNDLINGS",
        "permutation_bundles",
        "positional_bundles",
    ),
    "choices": (
        "DEFAULT_CHOICES",
        "AdvantageRule",
        "RiskChoices",
    ),
    "contracts": (
        "baseline_contract_violations",
        "expected_gradient_gap",
    ),
    "credit": (
        "CREDIT_ASSIGNMENTS",
        "score_credit",
        "std_credit",
        "sum_mean_credit",
        "uniform_credit",
    ),
    "defaults": (
        "DEFAULT_ADVANTAGE_BASELINE",
        "PAPER_ADVANTAGE_BASELINE",
        "resolve_advantage_baseline",
    ),
    "estimator": ("RiskEstimator",),
    "metrics": (
        "frac_prompts_all_failed",
        "mvar_objective",
        "push_signals",
        "risk_seeking_objective",
        "rvar_objective",
    ),
    "quantile_tracker": ("QuantileTracker",),
    "quantiles": (
        "QUANTILE_SOURCES",
        "empirical_quantiles",
        "group_quantiles",
    ),
}

if TYPE_CHECKING:
    from .advantages import (
        ADVANTAGE_SCALINGS,
        RISK_PROFILES,
        AdvantageScaling,
        ProfileParameter,
        RiskProfile,
        ScaledAdvantage,
        authors_code_mvar_advantage,
        authors_code_risk_seeking_advantage,
        mvar_advantage,
        register_risk_profile,
        register_scaled_advantage,
        risk_seeking_advantage,
        rvar_advantage,
        rvar_window,
        scaled_advantage,
    )
    from .baselines import ADVANTAGE_BASELINES, leave_one_out_baseline, no_baseline
    from .batch import RiskPOBatch, apply_advantage_rule, riskpo_advantages
    from .bundling import BUNDLINGS, permutation_bundles, positional_bundles
    from .choices import DEFAULT_CHOICES, AdvantageRule, RiskChoices
    from .contracts import baseline_contract_violations, expected_gradient_gap
    from .credit import CREDIT_ASSIGNMENTS, score_credit, std_credit, sum_mean_credit, uniform_credit
    from .defaults import DEFAULT_ADVANTAGE_BASELINE, PAPER_ADVANTAGE_BASELINE, resolve_advantage_baseline
    from .estimator import RiskEstimator
    from .metrics import frac_prompts_all_failed, mvar_objective, push_signals, risk_seeking_objective, rvar_objective
    from .quantile_tracker import QuantileTracker
    from .quantiles import QUANTILE_SOURCES, empirical_quantiles, group_quantiles

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
