"""The code and multi-modal tracks as registry entries: their datasets, benchmarks and reward, registered on import.

The data and reward layers hold the math track and never import a track, so the sandbox and the VLM stay out of them
and the folders import one way. This module, on the floor above, adds each track's entries to their registries. The
trainer's script and the evaluator read the registries from here, with every track in; a library user who picks a
track's dataset by name imports them from here too (``from riskpo_trl.tracks import load_train_dataset``).

A new track is one entry per registry here (and a scorer in ``evaluation/scorers.py`` for a new kind of grading).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

from .data.datasets import (
    BENCHMARKS,
    TRAIN_DATASETS,
    TRAIN_MIXTURES,
    LoaderSpec,
    add_dataset,
    load_benchmark,
    load_train_dataset,
)
from .rewards.registry import REWARD_BUILDERS, REWARD_FUNCS, RewardFunc, get_reward_funcs

__all__ = [
    "BENCHMARKS",
    "REWARD_BUILDERS",
    "REWARD_FUNCS",
    "TRAIN_DATASETS",
    "TRAIN_MIXTURES",
    "get_reward_funcs",
    "load_benchmark",
    "load_train_dataset",
]


# Each track is imported on use: the sandbox is needed by code runs only, the multi-modal package pulls in torch.
def _archer_code(split: str, data_files: str | Sequence[str] | None) -> Dataset:
    from .code.data import load_archer_code

    return load_archer_code(split, data_files=data_files)


def _geometry3k(split: str, data_files: str | Sequence[str] | None) -> Dataset:
    from .multimodal.geometry3k import load_geometry3k

    return load_geometry3k(split, data_files=data_files)


def _code_reward(settings: Mapping[str, Any] | None) -> RewardFunc:
    """Runs the completion's last ```python block on the row's `tests` in the sandbox."""
    from .code.reward import code_reward_from_settings

    return code_reward_from_settings(settings)


# Code track: ArcherCodeR's training file (Archer-6K), rows prompt + tests (riskpo_trl.code.data).
add_dataset(TRAIN_DATASETS, "archer_code", LoaderSpec("wizardII/ArcherCodeR-Dataset", "train", _archer_code, "code"))
# LiveCodeBench v5 as ArcherCodeR ships it (test/livecodebench_v5.json): plain-JSON test cases, so nothing has to be
# unpickled (the full release's compressed private tests need riskpo_trl.code.data.load_livecodebench).
add_dataset(BENCHMARKS, "livecodebench_v5", LoaderSpec("wizardII/ArcherCodeR-Dataset", "test", _archer_code, "code"))
REWARD_BUILDERS.add("code", _code_reward, help="the program of the completion run on the row's tests in the sandbox")

# Multi-modal track: Geometry3K, rows prompt + images + solution (riskpo_trl.multimodal.geometry3k); its reward,
# geometry_accuracy, is the math verifier and stays in the reward layer.
add_dataset(TRAIN_DATASETS, "geometry3k", LoaderSpec("hiyouga/geometry3k", "train", _geometry3k, "geometry"))
add_dataset(BENCHMARKS, "geometry3k_test", LoaderSpec("hiyouga/geometry3k", "test", _geometry3k, "geometry"))
