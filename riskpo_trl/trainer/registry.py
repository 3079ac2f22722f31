"""The trainers a recipe's ``trainer:`` can name, each with the config class its recipe is parsed into.

``riskpo`` is :class:`~riskpo_trl.trainer.riskpo_trainer.RiskPOTrainer`; the baselines are TRL's own classes,
unchanged (``trl.GRPOTrainer``, TRL's experimental ``GMPOTrainer``), so a comparison is against the GRPO its users run.
``riskpo-train`` applies the same job layer (:mod:`riskpo_trl.job`) to whichever one it builds. Entries import their
classes when asked for, so naming the registry (``--help``, recipe checks) loads neither torch nor TRL, and TRL's
experimental GMPO is only imported by runs that use it. A new baseline is one entry here (and a recipe under
``recipes/<model>/<method>/``); the script's help lists the entries' help.
"""

from __future__ import annotations

from collections.abc import Callable

from ..registry import Registry

TRAINERS: Registry[Callable[[], tuple[type, type]]] = Registry("trainer", needs_help=True)  # listed by --help


@TRAINERS.register("riskpo", help="RiskPOTrainer / RiskPOConfig")
def _riskpo() -> tuple[type, type]:
    from .config import RiskPOConfig
    from .riskpo_trainer import RiskPOTrainer

    return RiskPOConfig, RiskPOTrainer


@TRAINERS.register("grpo", help="trl.GRPOTrainer: GRPO, Dr. GRPO, DAPO, ... through loss_type")
def _grpo() -> tuple[type, type]:
    from trl import GRPOConfig, GRPOTrainer

    return GRPOConfig, GRPOTrainer


@TRAINERS.register("gmpo", help="trl.experimental.gmpo.GMPOTrainer, experimental in TRL")
def _gmpo() -> tuple[type, type]:
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    return GMPOConfig, GMPOTrainer


def check_trainer_name(name: str) -> None:
    TRAINERS.check(name)


def get_trainer_classes(name: str) -> tuple[type, type]:
    """``(config class, trainer class)`` of the trainer registered as ``name``; raises naming an unknown one."""
    return TRAINERS.get(name)()
