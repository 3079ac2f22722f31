"""RiskPO for the Hugging Face stack: risk-based policy optimization as a TRL trainer.

The public names below are imported on first use, so that entry points (``riskpo-train --help``, ``riskpo-eval``,
``riskpo-plot``) and light modules start without loading torch and TRL. Importing the package changes no global
state (warning filters, loggers).
"""

from typing import Any

__version__ = "0.1.0"

_RISK_NAMES = (
    "ADVANTAGE_BASELINES",
    "ADVANTAGE_SCALINGS",
    "BUNDLINGS",
    "CREDIT_ASSIGNMENTS",
    "QUANTILE_SOURCES",
    "RISK_PROFILES",
    "QuantileTracker",
    "RiskEstimator",
    "RiskPOBatch",
    "authors_code_mvar_advantage",
    "authors_code_risk_seeking_advantage",
    "empirical_quantiles",
    "group_quantiles",
    "leave_one_out_baseline",
    "mvar_advantage",
    "mvar_objective",
    "permutation_bundles",
    "positional_bundles",
    "register_risk_profile",
    "risk_seeking_advantage",
    "riskpo_advantages",
    "rvar_advantage",
    "rvar_window",
)
_TRAINER_NAMES = ("RiskPOConfig", "RiskPOTrainer", "ScoredBatch")

__all__ = sorted([*_RISK_NAMES, *_TRAINER_NAMES])


def __getattr__(name: str) -> Any:
    if name in _RISK_NAMES:
        from . import risk

        return getattr(risk, name)
    if name in _TRAINER_NAMES:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'riskpo_trl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
