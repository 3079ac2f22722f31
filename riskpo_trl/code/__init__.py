"""Code-generation track: a sandbox for model-written programs, the code reward, and dataset adapters.

A self-contained layer of the standard library only. The public names below are imported on first use, so that a
process that needs one part (the judge process, which imports only its judging modules) loads nothing else.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "executor": ("Executor", "EXECUTORS", "SandboxExecutor", "UnisolatedExecutor"),
    "judge": ("JudgeLimits", "Verdict"),
    "reward": ("CodeReward", "code_reward", "code_reward_from_settings", "extract_code"),
    "sandbox": (
        "Isolation",
        "Sandbox",
        "SandboxLimits",
        "SandboxStartError",
        "SandboxUnavailableError",
        "detect_isolation",
    ),
    "testspec": ("TestSpec",),
}

if TYPE_CHECKING:
    from .executor import EXECUTORS, Executor, SandboxExecutor, UnisolatedExecutor
    from .judge import JudgeLimits, Verdict
    from .reward import CodeReward, code_reward, code_reward_from_settings, extract_code
    from .sandbox import (
        Isolation,
        Sandbox,
        SandboxLimits,
        SandboxStartError,
        SandboxUnavailableError,
        detect_isolation,
    )
    from .testspec import TestSpec

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
