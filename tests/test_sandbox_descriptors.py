"""Correct programs score 1.0 however many descriptors the trainer holds: the sandbox, the judge and the staging
server wait with poll, not ``select.select`` (which refuses descriptors numbered 1,024 and up)."""

from __future__ import annotations

import os
import resource

import pytest

from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec

LIMITS = SandboxLimits(
    test_timeout_s=4.0, total_timeout_s=20.0, cpu_time_s=5, memory_mb=512, max_output_bytes=1 << 20, disk_mb=16
)
ADD = "a, b = map(int, input().split())\nprint(a + b)"
SPEC = TestSpec("stdin", ["1 2\n", "5 7\n"], ["3\n", "12\n"]).to_json()


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{program}\n```"}]


@pytest.fixture
def trainer_holding_1100_descriptors():
    """This process with 1,100 more open descriptors, so that every pipe, pidfd and socket made next is numbered
    above 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1100 + 256
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit ({hard}) is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) >= 1024
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_correct_programs_score_one_with_1100_descriptors_open(trainer_holding_1100_descriptors, isolation):
    sandbox = Sandbox(LIMITS, max_workers=2, isolation=isolation)
    try:
        reward = CodeReward(sandbox=sandbox)
        assert reward([as_completion(ADD), as_completion("print(3)")], [SPEC] * 2) == [1.0, 0.0]
    finally:
        sandbox.close()


@pytest.mark.slow
def test_150_workers_all_score_correct_programs_one():
    """More workers than 1,024 / (descriptors per worker): each holds a sandbox made ready ahead, with its pipes."""
    sandbox = Sandbox(LIMITS, max_workers=150)
    try:
        reward = CodeReward(sandbox=sandbox)
        assert reward([as_completion(ADD)] * 150, [SPEC] * 150) == [1.0] * 150
    finally:
        sandbox.close()
