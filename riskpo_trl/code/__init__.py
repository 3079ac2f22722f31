"""Code-generation track: a sandbox for model-written programs, the code reward, and dataset adapters.

A self-contained layer of the standard library only. The public names below are imported on first use, so that a
process that needs one part (the judge process, which imports only its judging modules) loads nothing else.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "Executor": "executor", "EXECUTORS": "executor", "SandboxExecutor": "executor", "UnisolatedExecutor": "executor",
    "JudgeLimits": "judge", "Verdict": "judge",
    "CodeReward": "reward", "code_reward": "reward", "code_reward_from_settings": "reward", "extract_code": "reward",
    "Isolation": "sandbox", "Sandbox": "sandbox", "SandboxLimits": "sandbox", "SandboxUnavailableError": "sandbox",
    "detect_isolation": "sandbox",
    "TestSpec": "testspec",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'riskpo_trl.code' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
