"""RiskPO for the Hugging Face stack: risk-based policy optimization as a TRL trainer.

The public names below are imported on first use, so that entry points (``riskpo-train --help``, ``riskpo-eval``,
``riskpo-plot``) and light modules start without loading torch and TRL. Importing the package changes no global
state (warning filters, loggers).
"""

from typing import TYPE_CHECKING

from .lazy import lazy_names

__version__ = "0.1.0"

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "risk": (
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
    ),
    "trainer": ("RiskPOConfig", "RiskPOTrainer", "ScoredBatch"),
}

if TYPE_CHECKING:
    from .risk import (
        ADVANTAGE_BASELINES,
        ADVANTAGE_SCALINGS,
        BUNDLINGS,
        CREDIT_ASSIGNMENTS,
        QUANTILE_SOURCES,
        RISK_PROFILES,
        QuantileTracker,
        RiskEstimator,
        RiskPOBatch,
        authors_code_mvar_advantage,
        authors_code_risk_seeking_advantage,
        empirical_quantiles,
        group_quantiles,
        leave_one_out_baseline,
        mvar_advantage,
        mvar_objective,
        permutation_bundles,
        positional_bundles,
        register_risk_profile,
        risk_seeking_advantage,
        riskpo_advantages,
        rvar_advantage,
        rvar_window,
    )
    from .trainer import RiskPOConfig, RiskPOTrainer, ScoredBatch

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
