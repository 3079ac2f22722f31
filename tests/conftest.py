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


RUN_SLOW_HINT = "run them with --runslow or RUN_SLOW=1"
SLOW_LEFT_OUT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow (or set RUN_SLOW=1)")


def run_slow(config) -> bool:
    """Slow tests run only when asked (transformers' RUN_SLOW convention); a -m expression selects on its own."""
    asked = os.environ.get("RUN_SLOW", "").lower() in ("1", "true", "yes")
    return asked or config.getoption("--runslow") or bool(config.getoption("markexpr"))


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(SLOW_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} tests marked slow were left out: {RUN_SLOW_HINT}")


# pytest-timeout's limit for the long kinds of test, where the suite's default (pyproject.toml: 600 s) is too short.
LONG_TEST_MARKERS = ("slow", "distributed", "vllm_real")
LONG_TEST_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config, items):
    give_long_tests_a_longer_timeout(items)
    leave_out_slow(config, items)
    skip_vllm_real_without_vllm(items)
    skip_gpu_without_cuda(items)


def give_long_tests_a_longer_timeout(items):
    for item in items:
        long = any(item.get_closest_marker(marker) is not None for marker in LONG_TEST_MARKERS)
        if long and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TEST_TIMEOUT_S))


def leave_out_slow(config, items):
    if run_slow(config):
        return
    if any("::" in arg for arg in config.args):
        # Tests named one by one: say why a slow one did not run rather than drop it silently.
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.skip(reason=f"marked slow: {RUN_SLOW_HINT}"))
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        config.stash[SLOW_LEFT_OUT] = len(slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def skip_vllm_real_without_vllm(items):
    reason = None
    for item in items:
        if item.get_closest_marker("vllm_real") is None:
            continue
        reason = reason or real_vllm_missing()
        if reason is None:
            return
        item.add_marker(pytest.mark.skip(reason=reason))


def skip_gpu_without_cuda(items):
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_model(path)
    return str(path)


@pytest.fixture
def prompt_dataset() -> Dataset:
    return make_prompt_dataset()
