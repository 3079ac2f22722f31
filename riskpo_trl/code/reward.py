"""The code reward for TRL: extract the program from a completion, run it on the problem's tests in the sandbox."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from ..rewards.grading import completion_text
from .assertions import UndecidableTestError
from .sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from .testspec import TestSpec

logger = logging.getLogger(__name__)

# The last fenced block tagged python/py/python3 (what the Archer and LiveCodeBench prompts ask for).
_CODE_BLOCK = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


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
    try:
        if isinstance(tests, str):
            return TestSpec.from_json(tests)
        if isinstance(tests, dict):
            return TestSpec(**tests)
    except UndecidableTestError as exc:
        _warn_refused(str(exc))
    except (ValueError, TypeError):
        return None
    return None


@functools.cache
def _warn_refused(reason: str) -> None:
    logger.warning("Code reward: assert-style tests refused (%s); their completions are unscorable (None). The dataset "
                   "loaders of riskpo_trl.code.data drop and count such rows.", reason)


class CodeReward:
    """TRL reward function: 1.0 iff the completion's last ```python block passes all of its problem's tests.

    Call it as ``reward(completions, tests, **kwargs)`` (TRL passes the dataset's ``tests`` column by name). Returns
    0.0 for a completion without a code block, failing any test, or whose run or grading raised anything (nothing a
    program does can crash training), and None (unscorable, ignored by the trainer) when the problem's tests are
    missing or unparseable. Completions run concurrently on ``max_workers`` sandbox workers, each bounded by
    ``limits.total_timeout_s``, so one batch takes at most about ``ceil(len(completions) / max_workers) *
    total_timeout_s``. The first call probes the sandbox and raises `SandboxUnavailableError` if bubblewrap does
    not work here (call ``reward.sandbox.check()`` to fail at start-up instead).
    """

    __name__ = "code_reward"  # TRL logs reward functions by name

    def __init__(self, limits: SandboxLimits | None = None, max_workers: int | None = None,
                 sandbox: Sandbox | None = None, isolation: str | None = None):
        self.sandbox = sandbox or Sandbox(limits=limits, max_workers=max_workers, isolation=isolation)
        self._pool: ThreadPoolExecutor | None = None

    def score(self, completion, tests) -> float | None:
        spec = parse_tests(tests)
        if spec is None:
            return None
        inputs = spec.sandbox_inputs()
        try:
            code = extract_code(completion_text(completion))
            if code is None:
                return 0.0
            result = self.sandbox.run(code, inputs, spec.style, spec.fn_name, output_caps=spec.output_caps())
            return float(result.ok and spec.passes(result.outputs))
        except SandboxUnavailableError:
            raise  # the machine's fault, not the completion's: training must not go on rewarding 0.0 for everything
        except Exception as exc:  # noqa: BLE001 - whatever a program makes the run or the grading do scores 0.0
            logger.warning("Code reward: running or grading a completion raised %s: %s; scoring it 0.0.",
                           type(exc).__name__, str(exc)[:200])
            return 0.0

    def __call__(self, completions, tests=None, **kwargs) -> list[float | None]:
        if tests is None:
            return [None] * len(completions)
        self.sandbox.check()  # raises if bwrap does not work here; warns on every batch with isolation="none"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.sandbox.max_workers, thread_name_prefix="code-reward")
        return list(self._pool.map(self.score, completions, tests))


def code_reward_from_settings(settings: Mapping[str, Any] | None = None) -> CodeReward:
    """A `CodeReward` from a recipe's ``code_sandbox:`` block: ``max_workers``, ``isolation`` ("bwrap" or, for
    trusted tests only, "none") plus any `SandboxLimits` field.

    Raises naming an unknown key, so a typo in a recipe fails at start-up instead of silently using a default, and
    `SandboxUnavailableError` when bubblewrap does not work on this machine (`Sandbox.check`).
    """
    settings = dict(settings or {})
    max_workers = settings.pop("max_workers", None)
    isolation = settings.pop("isolation", None)
    limit_names = {f.name for f in fields(SandboxLimits)}
    unknown = sorted(set(settings) - limit_names)
    if unknown:
        raise ValueError(
            f"code_sandbox has unknown key(s) {unknown}; valid keys are "
            f"{['isolation', 'max_workers', *sorted(limit_names)]}."
        )
    reward = CodeReward(limits=SandboxLimits(**settings), max_workers=max_workers, isolation=isolation)
    reward.sandbox.check()  # fail at start-up, not at the first batch, when bubblewrap does not work here
    return reward


code_reward = CodeReward()
"""The default code reward: default `SandboxLimits`, `default_max_workers()` workers (the machine's cores shared among
its training processes). Sandboxes are probed lazily."""
