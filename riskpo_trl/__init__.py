"""RiskPO for the Hugging Face stack: risk-based policy optimization as a TRL trainer."""

from .estimator import RiskEstimator
from .quantile_tracker import QuantileTracker
from .risk import (
    ADVANTAGE_VARIANTS,
    BUNDLINGS,
    CREDIT_ASSIGNMENTS,
    RISK_PROFILES,
    RiskPOBatch,
    authors_code_mvar_advantage,
    authors_code_risk_seeking_advantage,
    empirical_quantiles,
    group_quantiles,
    mvar_advantage,
    mvar_objective,
    permutation_bundles,
    positional_bundles,
    risk_seeking_advantage,
    riskpo_advantages,
    rvar_advantage,
    rvar_window,
)
from .riskpo_config import RiskPOConfig
from .riskpo_trainer import RiskPOTrainer

__version__ = "0.1.0"

__all__ = [
    "ADVANTAGE_VARIANTS",
    "BUNDLINGS",
    "CREDIT_ASSIGNMENTS",
    "RISK_PROFILES",
    "QuantileTracker",
    "RiskEstimator",
    "RiskPOBatch",
    "RiskPOConfig",
    "RiskPOTrainer",
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
]
