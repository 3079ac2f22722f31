"""The executor interface between `CodeReward` and whatever runs and judges programs.

`CodeReward` needs one thing per completion: did this program pass these tests? An `Executor` answers it. The
default, `SandboxExecutor`, runs the program in this machine's bubblewrap `Sandbox` and hands the run's raw report to
a judge process (`riskpo_trl.code.judge`). Another executor, for example a client of a remote execution service such
as SandboxFusion, plugs in through the same two methods.

What an executor must guarantee (`CodeReward` relies on each; docs/code_and_multimodal.md, "Executor contract"):

1. **Bounded time.** `Executor.run` returns within the executor's own per-completion bound (stated in its
   documentation) whatever the program or the tests do; it never blocks the caller's thread beyond that.
2. **Bounded trainer memory.** Whatever comes back to the trainer's process is bounded in size independently of what
   the program prints or returns: the caller receives a `Verdict`, not the program's output.
3. **Judged outside the trainer and outside the program.** No value the program produced is decoded, hashed,
   formatted or compared in the trainer's interpreter, and the verdict is decided where the program cannot reach:
   expected values never enter the program's environment, and the program cannot rewrite the code that compares.
4. **Independent completions.** One completion's run cannot change another's verdict (no shared interpreter, judge
   or mutable state between runs).
5. **Honest failures.** A failure of the program (wrong output, crash, timeout, any limit) is ``Verdict(False, ...)``;
   a failure of the execution machinery itself (the service or the sandbox cannot run anything) raises
   `SandboxUnavailableError`, so that training does not go on rewarding 0.0 for everything.
6. **Thread safety.** `run` may be called from ``max_workers`` threads at once.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .judge import JudgeLimits, Verdict, judge
from .sandbox import Sandbox
from .testspec import TestSpec


@runtime_checkable
class Executor(Protocol):
    """Runs a program on a problem's tests and returns the verdict (see the module docstring for the contract)."""

    max_workers: int  # how many `run` calls the caller should make at once

    def check(self) -> object:
        """Probe that programs can be run here; raise `SandboxUnavailableError` (with the fix) if they cannot."""

    def run(self, program: str, tests: TestSpec) -> Verdict:
        """Whether ``program`` passes every test of ``tests``."""


class SandboxExecutor:
    """The default executor: this machine's `Sandbox` (bubblewrap unless built with ``isolation="none"``) runs the
    program on the test inputs; a judge process per completion decides the verdict from the run's report.

    Per completion it takes at most ``sandbox.limits.total_timeout_s + judge_limits.timeout_s`` plus the time to kill
    and reap two processes (and to wait for a free sandbox slot when more than ``max_workers`` run at once).
    """

    def __init__(self, sandbox: Sandbox | None = None, judge_limits: JudgeLimits | None = None):
        self.sandbox = sandbox or Sandbox()
        self.judge_limits = judge_limits or JudgeLimits()

    @property
    def max_workers(self) -> int:
        return self.sandbox.max_workers

    def check(self) -> object:
        return self.sandbox.check()

    def run(self, program: str, tests: TestSpec) -> Verdict:
        report, error = self.sandbox.run_report(program, tests.sandbox_inputs(), tests.style, tests.fn_name,
                                                output_caps=tests.output_caps())
        if error is not None:
            return Verdict(False, error[:300])
        return judge(tests.to_json(), report, self.judge_limits)
