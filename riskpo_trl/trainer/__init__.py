"""The trainer layer: RiskPO on TRL (``riskpo_trainer``, ``config`` with ``config_checks`` and ``config_conversion``),
what every trainer of the package shares (``shared``), the trainers' plumbing in one module per concern
(``batch_hook``, ``token_mean``, ``unscored_rewards``, ``checkpoints``, ``checks``, ``regime_guard``, ``preemption``),
the model card and the registry of trainers a recipe can name (``registry``). Public names load on first use."""

from typing import Any

_SOURCES = {
    "RiskPOConfig": "config",
    "RiskPOTrainer": "riskpo_trainer",
    "ScoredBatch": "batch_hook",
    "TRAINERS": "registry",
    "get_trainer_classes": "registry",
}
__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    raise AttributeError(f"module 'riskpo_trl.trainer' has no attribute {name!r}")
