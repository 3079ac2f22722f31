"""The executor interface between `CodeReward` and whatever runs and judges programs, and the executors by name.

`CodeReward` needs one thing per completion: did this program pass these tests? An `Executor` answers it, under the
contract of docs/code_sandbox.md ("Executor contract": bounded time, bounded trainer memory, judged outside the
trainer and the program, independent completions, honest failures, thread safety), which `CodeReward` relies on.

A recipe picks one by name from `EXECUTORS` (``code_sandbox: {executor: bwrap}``, the default). A registered executor
is a class with ``from_settings(settings)``: it builds the executor from the rest of the ``code_sandbox:`` block and
raises a ValueError naming any key it does not know. Another one, for example a client of a remote execution service
such as SandboxFusion, is one registered class and its contract tests (docs/architecture.md); an instance can also be
passed directly, ``CodeReward(executor=...)``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Protocol, runtime_checkable

from ..registry import Registry, closest_names
from .judge import JudgeLimits, Verdict, judge
from .sandbox import Sandbox, SandboxLimits
from .testspec import TestSpec

logger = logging.getLogger(__name__)

EXECUTORS: Registry[type] = Registry("code_sandbox.executor", needs_help=True)
DEFAULT_EXECUTOR = "bwrap"


@runtime_checkable
class Executor(Protocol):
    """Runs a program on a problem's tests and returns the verdict (the contract: docs/code_sandbox.md)."""

    max_workers: int  # how many `run` calls the caller should make at once

    def check(self) -> object:
        """Probe that programs can be run here; raise `SandboxUnavailableError` (with the fix) if they cannot."""

    def run(self, program: str, tests: TestSpec) -> Verdict:
        """Whether ``program`` passes every test of ``tests``."""


@EXECUTORS.register(
    "bwrap", help="each program in a fresh bubblewrap sandbox, its report judged in a separate process (the default)"
)
class SandboxExecutor:
    """The default executor: this machine's `Sandbox` (bubblewrap unless built with ``isolation="none"``) runs the
    program on the test inputs; a judge process per completion decides the verdict from the run's report.

    Per completion it takes at most ``sandbox.limits.total_timeout_s + judge_limits.timeout_s`` plus the time to kill
    and reap two processes (and to wait for a free sandbox slot when more than ``max_workers`` run at once).
    """

    isolation = "bwrap"  # what `from_settings` builds its sandbox with

    def __init__(self, sandbox: Sandbox | None = None, judge_limits: JudgeLimits | None = None):
        self.sandbox = sandbox or Sandbox(isolation=self.isolation)
        self.judge_limits = judge_limits or JudgeLimits()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SandboxExecutor:
        """From ``max_workers``, any `SandboxLimits` field, and any `JudgeLimits` field prefixed with ``judge_``
        (``judge_timeout_s``, ``judge_cpu_time_s``, ``judge_memory_mb``)."""
        settings = dict(settings)
        max_workers = settings.pop("max_workers", None)
        judge_settings = {
            key[len("judge_") :]: settings.pop(key) for key in list(settings) if key.startswith("judge_")
        }
        limit_names = {field.name for field in fields(SandboxLimits)}
        judge_names = {field.name for field in fields(JudgeLimits)}
        unknown = sorted(set(settings) - limit_names) + sorted(
            f"judge_{key}" for key in set(judge_settings) - judge_names
        )
        if unknown:
            valid = ["executor", "max_workers", *sorted(limit_names), *sorted(f"judge_{n}" for n in judge_names)]
            raise ValueError(
                f"code_sandbox has unknown key(s) {unknown}{closest_names(unknown, valid)}; valid keys "
                f"for executor {cls.name()!r} are {valid}."
            )
        sandbox = Sandbox(limits=SandboxLimits(**settings), max_workers=max_workers, isolation=cls.isolation)
        return cls(sandbox, JudgeLimits(**judge_settings))

    @classmethod
    def name(cls) -> str:
        return next((name for name, entry in EXECUTORS.items() if entry is cls), cls.__name__)

    @property
    def max_workers(self) -> int:
        return self.sandbox.max_workers

    def check(self) -> object:
        return self.sandbox.check()

    def run(self, program: str, tests: TestSpec) -> Verdict:
        report, error = self.sandbox.run_report(
            program, tests.sandbox_inputs(), tests.style, tests.fn_name, output_caps=tests.output_caps()
        )
        if error is not None:
            return Verdict(False, error[:300])
        return judge(tests.to_json(), report, self.judge_limits)


@EXECUTORS.register(
    "none",
    help="the same runner and judge WITHOUT OS isolation: trusted code only, for local "
    "debugging; it warns on every batch",
)
class UnisolatedExecutor(SandboxExecutor):
    """`SandboxExecutor` with ``isolation="none"``: rlimits, a process-group kill and a temporary working directory,
    but no namespaces, no seccomp filter and the trainer's uid. For trusted code and tests only."""

    isolation = "none"
