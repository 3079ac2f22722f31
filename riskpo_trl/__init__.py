"""RiskPO for the Hugging Face stack: risk-based policy optimization as a TRL trainer.

The public names below are imported on first use, so that entry points (``riskpo-train --help``, ``riskpo-eval``,
``riskpo-plot``) and light modules start without loading torch and TRL.
"""

from typing import Any

__version__ = "0.1.0"

_RISK_NAMES = (
    "ADVANTAGE_VARIANTS",
    "BUNDLINGS",
    "CREDIT_ASSIGNMENTS",
    "RISK_PROFILES",
    "RiskPOBatch",
    "authors_code_mvar_advantage",
    "authors_code_risk_seeking_advantage",
    "empirical_quantiles",
    "group_quantiles",
    "mvar_advantage",
    "mvar_objective",
    "permutation_bundles",
    "positional_bundles",
    "risk_seeking_advantage",
    "riskpo_advantages",
    "rvar_advantage",
    "rvar_window",
)

__all__ = sorted(["QuantileTracker", "RiskEstimator", "RiskPOConfig", "RiskPOTrainer", *_RISK_NAMES])


def __getattr__(name: str) -> Any:
    if name in _RISK_NAMES:
        from . import risk

        return getattr(risk, name)
    if name == "RiskEstimator":
        from .estimator import RiskEstimator

        return RiskEstimator
    if name == "QuantileTracker":
        from .quantile_tracker import QuantileTracker

        return QuantileTracker
    if name == "RiskPOConfig":
        from .riskpo_config import RiskPOConfig

        return RiskPOConfig
    if name == "RiskPOTrainer":
        from .riskpo_trainer import RiskPOTrainer

        return RiskPOTrainer
    raise AttributeError(f"module 'riskpo_trl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
