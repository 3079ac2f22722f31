"""The trainers a recipe's ``trainer:`` can name, each with the config class its recipe is parsed into.

Entries import their classes when asked for, so naming the registry (``--help``, recipe checks) loads neither torch
nor TRL, and TRL's experimental GMPO is only imported by runs that use it.
"""

from __future__ import annotations

from collections.abc import Callable

from .naming import closest_name


def _riskpo() -> tuple[type, type]:
    from .riskpo_config import RiskPOConfig
    from .riskpo_trainer import RiskPOTrainer

    return RiskPOConfig, RiskPOTrainer


def _grpo() -> tuple[type, type]:
    from trl import GRPOConfig, GRPOTrainer

    return GRPOConfig, GRPOTrainer


def _gmpo() -> tuple[type, type]:
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    return GMPOConfig, GMPOTrainer


TRAINERS: dict[str, Callable[[], tuple[type, type]]] = {
    "riskpo": _riskpo,  # RiskPOTrainer / RiskPOConfig
    "grpo": _grpo,  # trl.GRPOTrainer: GRPO, Dr. GRPO, DAPO, ... through loss_type
    "gmpo": _gmpo,  # trl.experimental.gmpo.GMPOTrainer (experimental in TRL)
}


def check_trainer_name(name: str) -> None:
    if name not in TRAINERS:
        raise ValueError(f"trainer={name!r} is unknown{closest_name(name, TRAINERS)}; choose one of {list(TRAINERS)}.")


def get_trainer_classes(name: str) -> tuple[type, type]:
    """``(config class, trainer class)`` of the trainer registered as ``name``; raises naming an unknown one."""
    check_trainer_name(name)
    return TRAINERS[name]()
