"""The trainers a recipe's ``trainer:`` can name, each with the config class its recipe is parsed into.

Every trainer class is built the same way: a TRL GRPO-family trainer with this package's shared layer in front
(:class:`~riskpo_trl.trainer.shared.SharedTrainerMixin`); ``RiskPOTrainer`` is declared so, each baseline is made so
by :func:`package_trainer`. Entries import their classes when asked for, so naming the registry (``--help``, recipe
checks) loads neither torch nor TRL, and TRL's experimental GMPO is only imported by runs that use it. A new baseline
is one entry here (and a recipe under ``recipes/<model>/<method>/``); the script's help lists the entries' help.
"""

from __future__ import annotations

import functools
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

    return GRPOConfig, package_trainer(GRPOTrainer, GRPOConfig)


@TRAINERS.register("gmpo", help="trl.experimental.gmpo.GMPOTrainer, experimental in TRL")
def _gmpo() -> tuple[type, type]:
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    return GMPOConfig, package_trainer(GMPOTrainer, GMPOConfig)


@functools.cache
def package_trainer(trl_trainer: type, config_class: type) -> type:
    """``trl_trainer`` (a TRL GRPO-family trainer) with the behaviour every trainer of this package shares, under its
    own name; the same class on every call."""
    from .shared import SharedTrainerMixin

    name = trl_trainer.__name__
    return type(
        name,
        (SharedTrainerMixin, trl_trainer),
        {
            "__module__": __name__,
            "__doc__": f"`{trl_trainer.__module__}.{name}` with riskpo_trl's shared layer (`riskpo_trl.trainer.shared`).",
            "config_class": config_class,
            "_name": name.removesuffix("Trainer"),
        },
    )


def check_trainer_name(name: str) -> None:
    TRAINERS.check(name)


def get_trainer_classes(name: str) -> tuple[type, type]:
    """``(config class, trainer class)`` of the trainer registered as ``name``; raises naming an unknown one."""
    return TRAINERS.get(name)()
