"""Shared fixtures: a tiny local model and small datasets, nothing from the Hub (plain helpers: helpers.py)."""

from __future__ import annotations

import os

import pytest
from datasets import Dataset
from helpers import make_prompt_dataset, real_vllm_missing

from riskpo_trl.tiny_model import build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("vllm_real") is None:
            continue
        reason = reason or real_vllm_missing()
        if reason is None:
            return
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_model(path)
    return str(path)


@pytest.fixture
def prompt_dataset() -> Dataset:
    return make_prompt_dataset()
