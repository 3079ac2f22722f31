"""Shared fixtures: a tiny local model and small datasets, nothing from the Hub (plain helpers: helpers.py)."""

from __future__ import annotations

import os

import pytest
from datasets import Dataset
from helpers import make_prompt_dataset

from riskpo_trl.tiny_model import build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_model(path)
    return str(path)


@pytest.fixture
def prompt_dataset() -> Dataset:
    return make_prompt_dataset()
