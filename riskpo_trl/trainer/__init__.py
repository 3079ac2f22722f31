"""The trainer layer: RiskPO on TRL (``riskpo_trainer``, ``config`` with ``config_checks`` and ``config_conversion``),
its parts in one module per concern (``batch_hook``, ``token_mean``, ``checkpoints``,
``regime_guard``) and the registry of trainers a recipe can name (``registry``: RiskPO and TRL's own baselines). The
guard rails of a training job are the layer above (``riskpo_trl.job``). Public names load on first use."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "config": ("RiskPOConfig",),
    "riskpo_trainer": ("RiskPOTrainer",),
    "batch_hook": ("ScoredBatch",),
    "registry": ("TRAINERS", "get_trainer_classes"),
}

if TYPE_CHECKING:
    from .batch_hook import ScoredBatch
    from .config import RiskPOConfig
    from .registry import TRAINERS, get_trainer_classes
    from .riskpo_trainer import RiskPOTrainer

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
