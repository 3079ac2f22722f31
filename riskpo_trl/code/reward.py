"""The code reward for TRL: extract the program from a completion, run it on the problem's tests in the sandbox."""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..rewards.completions import completion_text
from .assertions import UndecidableTestError
from .executor import DEFAULT_EXECUTOR, EXECUTORS, Executor, SandboxExecutor
from .faults import SandboxFault
from .judge import JudgeLimits
from .sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from .single_flight import single_flight_cache
from .testspec import TestSpec

logger = logging.getLogger(__name__)

# The last fenced block tagged python/py/python3 (what the Archer and LiveCodeBench prompts ask for).
_CODE_BLOCK = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
MAX_FAULT_BATCHES = 3  # consecutive batches in which faults of the machinery left no completion with a verdict


def extract_code(text: str) -> str | None:
    """The last ```python fenced block of ``text`` (after any ``</think>``), or None when there is none."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def parse_tests(tests) -> TestSpec | None:
    """A `TestSpec` from a ``tests`` cell (its JSON string, a dict or a TestSpec), or None if missing/unparseable."""
    if isinstance(tests, TestSpec):
        return tests
    if isinstance(tests, str):
        return _parse_json_tests(tests)
    try:
        if isinstance(tests, dict):
            return TestSpec(**tests)
    except UndecidableTestError as exc:
        _warn_refused(str(exc))
    except (ValueError, TypeError, RecursionError):
        return None
    return None


@single_flight_cache(maxsize=64)  # a batch has a few dozen prompts; a cell can be megabytes (LiveCodeBench)
def _parse_json_tests(tests: str) -> TestSpec | None:
    """`parse_tests` of a JSON cell, remembered: every completion of a prompt carries the same cell, and a refusal
    (which may have spent the folding budget) is not recomputed for each, nor computed by each worker at once."""
    try:
        return TestSpec.from_json(tests)
    except UndecidableTestError as exc:
        _warn_refused(str(exc))
    except (ValueError, TypeError, RecursionError):
        pass
    return None


@functools.cache
def _warn_refused(reason: str) -> None:
    logger.warning(
        "Code reward: assert-style tests refused (%s); their completions are unscorable (None). The dataset "
        "loaders of riskpo_trl.code.data drop and count such rows.",
        reason,
    )


class CodeReward:
    """TRL reward function: 1.0 iff the completion's last ```python block passes all of its problem's tests.

    Call it as ``reward(completions, tests, **kwargs)`` (TRL passes the dataset's ``tests`` column by name). Returns
    0.0 only for what the program did: no code block, or a ``Verdict(False)`` of the executor (a failed test, a
    crash, its own deadline; nothing a program does can crash training). None (unscorable, ignored by the trainer)
    when the problem's tests are missing, unparseable or refused, and whenever the machinery around the program
    failed instead of giving a verdict (`SandboxFault`: a sandbox or judge that could not start, a full disk, a broken
    pipe; or any other exception of the executor), with one warning per cause. When such faults leave every
    completion of `MAX_FAULT_BATCHES` batches in a row without a verdict, it raises `SandboxUnavailableError` naming
    the cause and the fix. Programs run and are judged by an `Executor` (`riskpo_trl.code.executor`); the
    default, `SandboxExecutor`, runs each in a bubblewrap sandbox and judges its report in a separate judge process,
    so this process never handles a value the program produced: it receives a bounded `Verdict`. Completions run
    concurrently on the executor's ``max_workers`` threads, each bounded by the executor's per-completion bound
    (``limits.total_timeout_s + judge_limits.timeout_s`` plus a constant for the default), so one batch takes at
    most about ``ceil(len(completions) / max_workers)`` times that. The first call probes the executor and raises
    `SandboxUnavailableError` if it does not work here (call ``reward.executor.check()`` to fail at start-up instead).

    Args:
        limits, max_workers, isolation: build the default sandbox (`Sandbox`), unless ``sandbox`` or ``executor``
            is given.
        sandbox: the `Sandbox` of the default executor.
        judge_limits: limits of the default executor's judge processes (`JudgeLimits`).
        executor: any `Executor` instead of the default (then ``limits``, ``sandbox``... must not be given).
    """

    __name__ = "code_reward"  # TRL logs reward functions by name

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        max_workers: int | None = None,
        sandbox: Sandbox | None = None,
        isolation: str | None = None,
        judge_limits: JudgeLimits | None = None,
        executor: Executor | None = None,
    ):
        if executor is not None:
            given = [
                name
                for name, value in (
                    ("limits", limits),
                    ("max_workers", max_workers),
                    ("sandbox", sandbox),
                    ("isolation", isolation),
                    ("judge_limits", judge_limits),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"CodeReward got executor= and {given}: those configure the default executor; "
                    "configure your executor itself instead."
                )
            if not isinstance(executor, Executor):
                raise TypeError(
                    f"executor must provide max_workers, check() and run(program, tests) "
                    f"(riskpo_trl.code.executor.Executor); got {type(executor).__name__}."
                )
        else:
            executor = SandboxExecutor(
                sandbox or Sandbox(limits=limits, max_workers=max_workers, isolation=isolation), judge_limits
            )
        self.executor = executor
        self.sandbox = getattr(executor, "sandbox", None)  # the default executor's Sandbox (None for others)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_owner = os.getpid()  # a forked child has none of the pool's threads: it makes its own
        self._fault_batches = 0  # consecutive batches in which faults of the machinery left no verdict at all
        self.last_faults: _Tally | None = None  # the last batch's faults (`unscorable_causes`)

    def score(self, completion, tests) -> float | None:
        """One completion's score (`CodeReward`); a fault of the machinery is None, warned once per cause."""
        return self._score(completion, tests, _Tally())

    def _score(self, completion, tests, tally: _Tally) -> float | None:
        try:
            spec = parse_tests(tests)
        except Exception as exc:  # noqa: BLE001 - one row's cell, however broken, never fails the batch
            logger.warning(
                "Code reward: parsing a tests cell raised %s: %s; that row is unscorable (None).",
                type(exc).__name__,
                str(exc)[:200],
            )
            return None
        if spec is None:
            return None
        try:
            code = extract_code(completion_text(completion))
        except Exception as exc:  # noqa: BLE001 - an unreadable completion has no program: as without a code block
            logger.warning("Code reward: reading a completion raised %s; scoring it 0.0.", type(exc).__name__)
            return 0.0
        if code is None:
            return 0.0
        try:
            verdict = self.executor.run(code, spec)
        except SandboxUnavailableError:
            raise  # the machine's fault, not the completion's: training must not go on rewarding 0.0 for everything
        except SandboxFault as exc:  # the machinery failed, not the program: unscorable, never 0.0
            tally.fault(exc.cause, exc.fix, str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - the contract gives a failing program a Verdict, never an exception
            tally.fault(f"{type(exc).__name__} in the executor", "see the error above (a bug to report)", str(exc))
            return None
        tally.verdicts += 1
        return float(verdict.passed)

    def __call__(self, completions, tests=None, **kwargs) -> list[float | None]:
        if tests is None:
            return [None] * len(completions)
        self.executor.check()  # raises if bwrap does not work here; warns on every batch with isolation="none"
        if self._pool is None or self._pool_owner != os.getpid():
            self._pool_owner = os.getpid()
            self._pool = ThreadPoolExecutor(max_workers=self.executor.max_workers, thread_name_prefix="code-reward")
        tally = _Tally()
        scores = list(self._pool.map(functools.partial(self._score, tally=tally), completions, tests))
        self._after_batch(tally)
        return scores

    def _after_batch(self, tally: _Tally) -> None:
        with _FAULT_LOCK:
            self.last_faults = tally
            if tally.verdicts or not tally.causes:
                self._fault_batches = 0
                return
            self._fault_batches += 1
            if self._fault_batches < MAX_FAULT_BATCHES:
                return
        raise SandboxUnavailableError(
            f"No completion got a verdict in {MAX_FAULT_BATCHES} batches in a row: {tally.describe()}. Fix: "
            f"{tally.fix()}."
        )

    def unscorable_causes(self) -> str | None:
        """Why the last batch's completions were unscorable when the machinery was the reason (None otherwise): what
        the trainer's "nothing scorable" stop names."""
        tally = self.last_faults
        return tally.describe() if tally is not None and tally.causes else None


_FAULT_LOCK = threading.Lock()


class _Tally:
    """Faults and verdicts of one batch (thread-safe); warns once per cause per process."""

    _warned: set[str] = set()

    def __init__(self):
        self.verdicts = 0
        self.causes: Counter[str] = Counter()
        self.fixes: dict[str, str] = {}

    def fault(self, cause: str, fix: str, message: str) -> None:
        with _FAULT_LOCK:
            self.causes[cause] += 1
            self.fixes.setdefault(cause, fix)
            first = cause not in _Tally._warned
            _Tally._warned.add(cause)
        if first:
            logger.warning(
                "Code reward: %s; such completions are unscorable (None), never 0.0, and counted in "
                "risk/frac_unscorable (warned once per cause).",
                message[:300],
            )

    def describe(self) -> str:
        return ", ".join(f"{cause[:200]} ({count} completion(s))" for cause, count in self.causes.most_common(3))

    def fix(self) -> str:
        return "; ".join(self.fixes[cause][:300] for cause, _ in self.causes.most_common(3) if self.fixes[cause])


def code_reward_from_settings(settings: Mapping[str, Any] | None = None) -> CodeReward:
    """A `CodeReward` from a recipe's ``code_sandbox:`` block: ``executor``, a name of `EXECUTORS` (``bwrap``, the
    default, or, for trusted code only, ``none``), and the settings that executor takes (`SandboxExecutor.from_settings`:
    ``max_workers``, any `SandboxLimits` field, ``judge_`` + any `JudgeLimits` field).

    Raises naming an unknown executor or key (and the closest valid one), so a typo in a recipe fails at start-up
    instead of silently using a default, and `SandboxUnavailableError` when the executor cannot run programs here.
    """
    settings = dict(settings or {})
    if "isolation" in settings:
        raise ValueError(
            f"code_sandbox.isolation is now code_sandbox.executor: write executor: "
            f"{settings['isolation']} (one of {list(EXECUTORS)})."
        )
    name = settings.pop("executor", DEFAULT_EXECUTOR)
    reward = CodeReward(executor=EXECUTORS.get(name).from_settings(settings))
    reward.executor.check()  # fail at start-up, not at the first batch, when programs cannot run here
    return reward


code_reward = CodeReward()
"""The default code reward: default `SandboxLimits`, `default_max_workers()` workers (the machine's cores shared among
its training processes). Sandboxes are probed lazily."""
