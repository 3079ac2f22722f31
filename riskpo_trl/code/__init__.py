"""Code-generation track: a sandbox for model-written programs, the code reward, and dataset adapters."""

from .executor import Executor, SandboxExecutor
from .judge import JudgeLimits, Verdict
from .reward import CodeReward, code_reward, code_reward_from_settings, extract_code
from .sandbox import Isolation, Sandbox, SandboxLimits, SandboxUnavailableError, detect_isolation
from .testspec import TestSpec

__all__ = [
    "CodeReward", "Executor", "Isolation", "JudgeLimits", "Sandbox", "SandboxExecutor", "SandboxLimits",
    "SandboxUnavailableError", "TestSpec", "Verdict", "code_reward", "code_reward_from_settings", "detect_isolation",
    "extract_code",
]
