"""The contract every executor keeps (docs/code_sandbox.md, "Executor contract"), as a check a plug-in runs on its
own executor: a new executor is one registered class and a call of `check_executor_contract` on it in its tests
(docs/architecture.md, the drill)::

    from riskpo_trl.code.contracts import check_executor_contract

    check_executor_contract(MyExecutor.from_settings({}), bound_s=10.0)

Standard library only, like the rest of `riskpo_trl.code`.
"""

from __future__ import annotations

import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from .judge import MAX_VERDICT_BYTES, Verdict
from .testspec import TestSpec

# Prints the expected value if it can find it where a program looks first: its environment, arguments, stdin, and
# the files of its working directory.
LOOKS_FOR_THE_EXPECTED_VALUE = """
import os, sys
texts = [*os.environ.values(), *sys.argv, sys.stdin.read()]
for name in ("/proc/self/cmdline", "/proc/self/environ"):
    try:
        texts.append(open(name, errors="ignore").read())
    except OSError:
        pass
for root, _, files in os.walk("."):
    for name in files:
        try:
            texts.append(open(os.path.join(root, name), errors="ignore").read(1 << 20))
        except OSError:
            pass
found = [text for text in texts if "riskpo-expected-" in text]
print("riskpo-expected-" + found[0].split("riskpo-expected-")[1][:32] if found else "nothing")
"""
ADD = "def add(a, b):\n    return a + b"


class ExecutorContractError(AssertionError):
    """An executor breaks its contract; the message names each broken case."""


def executor_contract_violations(executor, bound_s: float) -> list[str]:
    """Run the contract's cases on ``executor`` at once from several threads and name what it breaks: honest programs
    pass and wrong ones fail in every test style, a crash, an endless loop and an output flood fail with a short
    reason, a program cannot find the expected value, and the whole batch takes at most ``bound_s`` (the executor's
    documented bound per completion) times the rounds its ``max_workers`` need."""
    executor.check()
    secret = f"riskpo-expected-{uuid.uuid4().hex}"
    stdin = TestSpec("stdin", ["2 3\n"], ["5"])
    cases = [
        ("stdin", "a, b = map(int, input().split())\nprint(a + b)", stdin, True),
        ("stdin, wrong", "print(6)", stdin, False),
        ("functional", ADD, TestSpec("functional", ["2\n3"], ["5"], fn_name="add"), True),
        ("assert", ADD, TestSpec("assert", ["assert add(2, 3) == 5\nassert add(-1, 1) == 0"], [""]), True),
        ("assert, wrong", ADD.replace("+", "-"), TestSpec("assert", ["assert add(2, 3) == 5"], [""]), False),
        ("a crash", "raise SystemExit(3)", stdin, False),
        ("an endless loop", "while True:\n    pass", stdin, False),
        ("an output flood", "import sys\nwhile True:\n    sys.stdout.write('5' * 65536)", stdin, False),
        ("looks for the expected value", LOOKS_FOR_THE_EXPECTED_VALUE, TestSpec("stdin", ["x\n"], [secret]), False),
    ]
    start = time.monotonic()
    with ThreadPoolExecutor(len(cases)) as pool:
        verdicts = list(pool.map(lambda case: executor.run(case[1], case[2]), cases))
    elapsed = time.monotonic() - start
    broken = []
    for (name, _, _, passes), verdict in zip(cases, verdicts):
        if not isinstance(verdict, Verdict):
            broken.append(f"{name}: run returned {type(verdict).__name__}, not a Verdict")
            continue
        if verdict.passed is not passes:
            broken.append(f"{name}: {'failed' if passes else 'passed'} ({verdict.reason!r})")
        if len(verdict.reason.encode()) > MAX_VERDICT_BYTES:
            broken.append(f"{name}: a reason of {len(verdict.reason.encode())} bytes (at most {MAX_VERDICT_BYTES})")
    rounds = math.ceil(len(cases) / max(1, executor.max_workers))
    if elapsed > bound_s * rounds:
        broken.append(f"the batch took {elapsed:.1f} s, over {bound_s} s x {rounds} rounds of max_workers")
    return broken


def check_executor_contract(executor, bound_s: float) -> None:
    """Raise `ExecutorContractError` naming every case of :func:`executor_contract_violations` that ``executor``
    breaks."""
    broken = executor_contract_violations(executor, bound_s)
    if broken:
        raise ExecutorContractError(f"{type(executor).__name__} breaks the executor contract: " + "; ".join(broken))
