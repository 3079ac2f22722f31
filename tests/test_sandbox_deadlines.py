"""The per-test deadline is the trainer's, outside the sandbox: a correct program that is too slow scores 0.0 whatever
it does with signals, exceptions or the runner's report pipe, while a fast one still scores 1.0.

Each slow program would print or return the right answer after 3 s of work per test, within ``total_timeout_s``, so
only the per-test deadline (0.5 s) can fail it: a reward of 1.0 means the deadline was extended."""

from __future__ import annotations

import textwrap
import time

import pytest

from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec

DEADLINE = SandboxLimits(
    test_timeout_s=0.5, total_timeout_s=12.0, cpu_time_s=10, memory_mb=512, max_output_bytes=1 << 20, disk_mb=16
)

# Ways a program could try to outlive an in-process timer. Each defines slow(), which returns after 3 s.
STUBBORN = {
    "ignores_sigalrm": """
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        def slow():
            end = time.monotonic() + 3
            while time.monotonic() < end:
                sum(range(1000))
        """,
    "catches_base_exception": """
        import time
        def slow():
            end = time.monotonic() + 3
            while time.monotonic() < end:
                try:
                    while time.monotonic() < end:
                        time.sleep(0.01)
                except BaseException:
                    pass
        """,
    "blocks_every_signal": """
        import signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))
        def slow():
            time.sleep(3)
        """,
    # writes start marks and empty outputs into the runner's report pipe (fd 3), as if tests were starting anew
    "forges_report_records": """
        import os, time
        def slow():
            end = time.monotonic() + 3
            while time.monotonic() < end:
                for record in (b"S0\\n", b"O0\\n"):
                    try:
                        os.write(3, record)
                    except OSError:
                        pass
                time.sleep(0.1)
        """,
}

PROGRAMS = {  # style -> (program body calling slow(), test spec)
    "stdin": ("a, b = map(int, input().split())\nslow()\nprint(a + b)", TestSpec("stdin", ["1 2\n"], ["3\n"])),
    "functional": (
        "def add(a, b):\n    slow()\n    return a + b",
        TestSpec("functional", ["1\n2"], ["3"], fn_name="add"),
    ),
    "assert": ("def add(a, b):\n    slow()\n    return a + b", TestSpec("assert", ["assert add(1, 2) == 3"], [""])),
}


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{program}\n```"}]


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(sandbox=Sandbox(DEADLINE, max_workers=2))


@pytest.mark.parametrize("style", PROGRAMS)
def test_a_slow_program_scores_zero_whatever_it_does_with_signals(reward, style):
    body, spec = PROGRAMS[style]
    completions = [as_completion(textwrap.dedent(trick) + body) for trick in STUBBORN.values()]
    assert reward(completions, [spec.to_json()] * len(completions)) == [0.0] * len(STUBBORN)


@pytest.mark.parametrize("style", PROGRAMS)
def test_a_fast_program_still_scores_one(reward, style):
    body, spec = PROGRAMS[style]
    program = "def slow():\n    pass\n" + body
    assert reward([as_completion(program)], [spec.to_json()]) == [1.0]


def test_every_test_has_its_own_deadline():
    """Four tests of 0.3 s each pass a 1 s deadline that their sum exceeds; one of 3 s after them fails the program."""
    reward = CodeReward(sandbox=Sandbox(SandboxLimits(test_timeout_s=1.0, total_timeout_s=12.0), max_workers=2))
    program = "import time\nn = int(input())\ntime.sleep(n / 10)\nprint(n)"
    quick = TestSpec("stdin", ["3\n"] * 4, ["3\n"] * 4)
    slow = TestSpec("stdin", ["3\n", "3\n", "30\n"], ["3\n", "3\n", "30\n"])
    assert reward([as_completion(program)] * 2, [quick.to_json(), slow.to_json()]) == [1.0, 0.0]


def test_an_unisolated_run_has_the_same_deadline():
    reward = CodeReward(sandbox=Sandbox(DEADLINE, max_workers=1, isolation="none"))
    body, spec = PROGRAMS["stdin"]
    slow = textwrap.dedent(STUBBORN["catches_base_exception"]) + body
    fast = "def slow():\n    pass\n" + body
    assert reward([as_completion(slow), as_completion(fast)], [spec.to_json()] * 2) == [0.0, 1.0]


ENDS_ITS_OWN_REPORT = {
    # writes the runner's end record into the report pipe (fd 3) itself, then works on
    "writes_an_end_record": "import os, time\nos.write(3, b'D0\\n')\ntime.sleep(20)\nprint(3)",
    # a forked child raises: its copy of the runner writes the error record, the parent works on
    "forks_a_child_that_raises": "import os, time\nif os.fork() == 0:\n    raise ValueError\ntime.sleep(20)\nprint(3)",
}


@pytest.mark.parametrize("program", ENDS_ITS_OWN_REPORT.values(), ids=ENDS_ITS_OWN_REPORT)
def test_an_end_record_stops_no_clock(reward, program):
    """A one-test run ends within (tests + 1) x test_timeout_s of its start, not at total_timeout_s (12 s here)."""
    spec = TestSpec("stdin", ["1 2\n"], ["3\n"])
    start = time.monotonic()
    assert reward([as_completion(program)], [spec.to_json()]) == [0.0]
    assert time.monotonic() - start < 2 * DEADLINE.test_timeout_s + 4  # + start-up, judging and the kill


@pytest.mark.slow
def test_a_million_tests_cost_the_trainer_under_two_seconds_of_cpu():
    """The bound an earlier round set, at the default limits: 10^6 stdin cases (scored 0.0, they cannot all run in
    30 s) whose records arrive as fast as the runner writes them, read in blocks rather than one wakeup each. Before,
    2.6 s on a machine at load 10 (the sandbox and the judge are other processes, not counted)."""
    reward = CodeReward(sandbox=Sandbox(SandboxLimits(), max_workers=1))
    spec = TestSpec("stdin", ["1\n"] * 10**6, ["1\n"] * 10**6).to_json()
    reward([as_completion("print(input())")], [TestSpec("stdin", ["1\n"], ["1\n"]).to_json()])  # warm
    cpu = time.process_time()
    assert reward([as_completion("print(input())")], [spec]) == [0.0]
    assert time.process_time() - cpu < 2.0
