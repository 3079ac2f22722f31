"""The sandbox's guarantees in the layouts users run, each broken on purpose: only a program's own behaviour scores it
0.0. A full TMPDIR, a fork from another thread during scoring, a trainer that is PID 1 of its PID namespace with a
second process starting sandboxes: honest programs still score 1.0, and a fault of the machinery is None (then a
named stop), never 0.0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec

LIMITS = SandboxLimits(
    test_timeout_s=8.0, total_timeout_s=20.0, cpu_time_s=5, memory_mb=512, max_output_bytes=8 << 20, disk_mb=16
)
ADD = [{"role": "assistant", "content": "```python\na, b = map(int, input().split())\nprint(a + b)\n```"}]
SPEC = TestSpec("stdin", ["1 2\n"], ["3\n"]).to_json()

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs mounts, PID namespaces)")


@pytest.fixture
def small_tmpdir():
    """A 1 MiB tmpfs, which the trainer below fills while it trains."""
    directory = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", directory], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", directory], check=False)
        os.rmdir(directory)


SCORE_WITH_TMPDIR = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
if sys.argv[1] == "no-memfd":  # break the invariant: the scoring path's files in TMPDIR, which fills
    del os.memfd_create
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from riskpo_trl.code.testspec import TestSpec
reward = CodeReward(sandbox=Sandbox(SandboxLimits(test_timeout_s=8.0, total_timeout_s=20.0, disk_mb=16), max_workers=2))
add = [{"role": "assistant", "content": "```python\\nprint(sum(map(int, input().split())))\\n```"}]
tests = [TestSpec("stdin", ["1 2\\n"], ["3\\n"]).to_json()] * 2
print(reward([add, add], tests), flush=True)
fill = os.open(os.path.join(os.environ["TMPDIR"], "fill"), os.O_WRONLY | os.O_CREAT)
for size in (65536, 4096, 1):  # to the last byte
    try:
        while True:
            os.write(fill, bytes(size))
    except OSError:
        pass
try:
    for batch in range(4):
        print(reward([add, add], tests), flush=True)
except SandboxUnavailableError as exc:
    print("STOP", exc, flush=True)
"""


@root_only
def test_a_tmpdir_that_fills_never_scores_an_honest_program_zero(small_tmpdir):
    env = {**os.environ, "TMPDIR": small_tmpdir}
    run = subprocess.run(
        [sys.executable, "-c", SCORE_WITH_TMPDIR, "memfd"], capture_output=True, text=True, timeout=180, env=env
    )
    assert run.stdout.splitlines() == ["[1.0, 1.0]"] * 5, run.stderr[-3000:]
    # Broken on purpose: the spec file and the judge's payload in TMPDIR. Unscorable once it is full, then a stop
    # that names the cause and the fix.
    os.unlink(os.path.join(small_tmpdir, "fill"))
    broken = subprocess.run(
        [sys.executable, "-c", SCORE_WITH_TMPDIR, "no-memfd"], capture_output=True, text=True, timeout=180, env=env
    )
    lines = broken.stdout.splitlines()
    assert lines[:3] == ["[1.0, 1.0]", "[None, None]", "[None, None]"], broken.stderr[-3000:]
    assert lines[3].startswith("STOP") and "no space left" in lines[3] and "TMPDIR" in lines[3], lines
    warnings = [line for line in broken.stderr.splitlines() if "unscorable (None), never 0.0" in line]
    assert len(warnings) == 1, broken.stderr[-3000:]  # one warning per cause, not one per completion
    assert "No space left" in warnings[0]


def test_a_fork_from_another_thread_during_scoring_never_holds_a_verdict():
    """A thread forks every 0.1 s (each child lives 30 s, past the judge's deadline, holding whatever it inherited) while completions with a
    2 MB test cell are judged: every honest one scores 1.0."""
    big = "x" * (2 << 20)
    spec = TestSpec("stdin", [big + "\n"], [big + "\n"]).to_json()
    echo = [{"role": "assistant", "content": "```python\nprint(input())\n```"}]
    sandbox = Sandbox(LIMITS, max_workers=2)
    reward = CodeReward(sandbox=sandbox)
    assert reward([echo], [spec]) == [1.0]
    stop, children = threading.Event(), []

    def fork_repeatedly():
        while not stop.is_set():
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
            time.sleep(0.1)

    forker = threading.Thread(target=fork_repeatedly)
    forker.start()
    try:
        scores = reward([echo] * 8, [spec] * 8)
    finally:
        stop.set()
        forker.join()
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        sandbox.close()
    assert len(children) >= 5  # forks did fall into the scoring
    assert scores == [1.0] * 8


PID1_TRAINER = """
import subprocess, sys, threading, time, os
assert os.getpid() == 1
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec
reward = CodeReward(sandbox=Sandbox(SandboxLimits(test_timeout_s=15.0, total_timeout_s=30.0, disk_mb=16), max_workers=2))
slow = [{"role": "assistant", "content": "```python\\nimport time\\ntime.sleep(4)\\nprint(sum(map(int, input().split())))\\n```"}]
spec = TestSpec("stdin", ["1 2\\n"], ["3\\n"]).to_json()
result = {}
worker = threading.Thread(target=lambda: result.update(scores=reward([slow, slow], [spec] * 2)))
worker.start()
time.sleep(1.0)  # the first trainer's sandboxes are in flight; they are its children, whose parent PID is 1
second = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, timeout=120)
worker.join()
print(result["scores"], second.stdout.strip(), flush=True)
print(second.stderr[-2000:], file=sys.stderr)
"""
SECOND = """
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec
add = [{"role": "assistant", "content": "```python\\nprint(sum(map(int, input().split())))\\n```"}]
reward = CodeReward(sandbox=Sandbox(SandboxLimits(test_timeout_s=8.0, total_timeout_s=20.0, disk_mb=16), max_workers=1))
print(reward([add], [TestSpec("stdin", ["1 2\\n"], ["3\\n"]).to_json()]))
"""


@root_only
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_second_process_in_a_pid1_trainers_namespace_kills_none_of_its_sandboxes():
    """`docker run` without `--init`: the trainer is PID 1, so its sandboxes' parent is PID 1; a second process that
    starts sandboxes there (a second run, an evaluation) must not take them for a dead trainer's."""
    run = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, "-c", PID1_TRAINER, SECOND],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.stdout.strip() == "[1.0, 1.0] [1.0]", run.stderr[-3000:]


LIMITED_TRAINER = """
import json, sys
from riskpo_trl.code.reward import code_reward_from_settings
from riskpo_trl.code.sandbox import SandboxUnavailableError
from riskpo_trl.code.testspec import TestSpec
settings = json.loads(sys.argv[1])
try:
    reward = code_reward_from_settings({"test_timeout_s": 8.0, "total_timeout_s": 20.0, "disk_mb": 16, **settings})
except SandboxUnavailableError as exc:
    print("REFUSED", exc)
    sys.exit(0)
probe = reward.executor.sandbox.run("print(open('/proc/self/oom_score_adj').read().strip())", [""])
add = [{"role": "assistant", "content": "```python\\nprint(sum(map(int, input().split())))\\n```"}]
print("STARTED", probe.outputs, reward([add, add], [TestSpec("stdin", ["1 2\\n"], ["3\\n"]).to_json()] * 2))
"""


def own_v1_cgroup(controller: str) -> str | None:
    with open("/proc/self/cgroup") as own:
        for line in own:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                directory = os.path.join("/sys/fs/cgroup", controller, path.lstrip("/"))
                return directory if os.path.isdir(directory) else None
    return None


@pytest.fixture
def limited_cgroup():
    """A v1 memory cgroup of 1 GiB and a pids cgroup of 64 tasks, as `docker run --memory 1g --pids-limit 64` makes;
    yields a command prefix that starts a process in both."""
    made = []
    for controller, limit_file, limit in (("memory", "memory.limit_in_bytes", 1 << 30), ("pids", "pids.max", 64)):
        own = own_v1_cgroup(controller)
        if own is None or not os.access(own, os.W_OK):
            pytest.skip(f"needs a writable cgroup v1 {controller} hierarchy")
        path = os.path.join(own, f"riskpo-test-container-{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, limit_file), "w") as file:
            file.write(str(limit))
        made.append(path)
    joins = " && ".join(f"echo $$ > {path}/cgroup.procs" for path in made)
    yield ["sh", "-c", f'{joins} && exec "$@"', "sh"]
    for path in made:
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)


def run_limited(prefix: list[str], settings: dict) -> str:
    import json

    run = subprocess.run(
        [*prefix, sys.executable, "-c", LIMITED_TRAINER, json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


@root_only
def test_a_trainer_whose_cgroup_limit_the_programs_would_share_refuses_to_start(limited_cgroup):
    """The red team's layout: 3 workers of 600 MiB programs in a 1 GiB container would let the programs get the
    trainer OOM-killed. Refused in one line naming the limit, the figures and settings that fit; the same memory
    limit with programs that fit starts, and its sandbox processes are the OOM killer's first choice."""
    refused = run_limited(limited_cgroup, {"max_workers": 3, "memory_mb": 600})
    assert refused.startswith("REFUSED") and "\n" not in refused, refused
    assert "memory limit of 1024 MiB" in refused and "max_workers 3 x memory_mb 600" in refused, refused
    assert "set code_sandbox max_workers: 1 or memory_mb: " in refused, refused
    refused = run_limited(limited_cgroup, {"max_workers": 3, "memory_mb": 128, "max_processes": 32})
    assert refused.startswith("REFUSED") and "pids limit of 64" in refused and "max_processes: " in refused, refused
    started = run_limited(limited_cgroup, {"max_workers": 2, "memory_mb": 200, "max_processes": 8})
    assert started == "STARTED ['1000\\n'] [1.0, 1.0]", started


class FaultyExecutor:
    """An executor whose machinery fails (``fault``) for programs that print "x", else gives a verdict."""

    max_workers = 2

    def __init__(self, fault: Exception):
        self.fault = fault

    def check(self):
        return None

    def run(self, program, tests):
        from riskpo_trl.code.judge import Verdict

        if "x" in program:
            raise self.fault
        return Verdict("3" in program)


def test_only_a_verdict_scores_zero_and_a_persistent_fault_stops_with_its_cause_and_fix(caplog):
    from riskpo_trl.code.faults import SandboxFault
    from riskpo_trl.code.sandbox import SandboxUnavailableError

    fault = SandboxFault("the judge could not judge: cannot fork", cause="judge: cannot fork", fix="free some memory")
    reward = CodeReward(executor=FaultyExecutor(fault))
    faulty = [{"role": "assistant", "content": "```python\nprint('x')\n```"}]
    wrong = [{"role": "assistant", "content": "```python\nprint(4)\n```"}]
    with caplog.at_level("WARNING"):
        assert reward([faulty, wrong, faulty], [SPEC] * 3) == [None, 0.0, None]  # a verdict came: no stop
        assert reward([faulty, faulty], [SPEC] * 2) == [None, None]
        assert reward([faulty, faulty], [SPEC] * 2) == [None, None]
        assert reward.unscorable_causes() == "judge: cannot fork (2 completion(s))"
        with pytest.raises(SandboxUnavailableError, match=r"3 batches in a row: judge: cannot fork.*free some memory"):
            reward([faulty, faulty], [SPEC] * 2)
    assert len([r for r in caplog.records if "cannot fork" in r.getMessage()]) == 1  # once per cause
    # Any other exception of an executor is not a verdict either: the contract gives a failing program a Verdict.
    assert CodeReward(executor=FaultyExecutor(OSError(32, "Broken pipe")))([faulty], [SPEC]) == [None]


OOM_TRAINER = """
import sys, threading
from riskpo_trl.code import cgroups
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
if sys.argv[1] == "no-oom-score":  # break the invariant: sandbox processes as likely OOM victims as the trainer
    cgroups.make_oom_victim = lambda pid: None
held = bytearray(700 << 20)  # the trainer's model, touched
for index in range(0, len(held), 4096):
    held[index] = 1
sandbox = Sandbox(SandboxLimits(test_timeout_s=20.0, total_timeout_s=30.0, memory_mb=600, disk_mb=16), max_workers=2)
hog = "import time\\nblock = bytearray(450 << 20)\\nfor i in range(0, len(block), 4096):\\n    block[i] = 1\\ntime.sleep(3)\\nprint(1)"
results = []
runs = [threading.Thread(target=lambda: results.append(sandbox.run(hog, [""]).error)) for _ in range(2)]
for run in runs:
    run.start()
for run in runs:
    run.join()
print("ALIVE", sorted(str(error)[:40] for error in results), flush=True)
"""


@root_only
@pytest.mark.slow  # 19 s at load 7: two trainers of 700 MB in a limited cgroup
def test_in_a_shared_memory_limit_the_kernel_kills_a_program_never_the_trainer(limited_cgroup):
    """The red team's layout without the start-up check (a `Sandbox` used directly): a trainer holding 700 MB and two
    programs of 450 MB in a 1 GiB cgroup. The OOM killer takes a program (oom_score_adj 1000), and the trainer lives;
    with the sandbox's OOM score left as the trainer's, the kernel killed the trainer instead."""
    run = subprocess.run(
        [*limited_cgroup, sys.executable, "-c", OOM_TRAINER, "oom-score"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.startswith("ALIVE"), (run.returncode, run.stderr[-2000:])
    assert "exit code 137" in run.stdout  # a program was the one killed (SIGKILL, as bwrap reports it)
    broken = subprocess.run(
        [*limited_cgroup, sys.executable, "-c", OOM_TRAINER, "no-oom-score"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert broken.returncode == -9, (broken.returncode, broken.stdout, broken.stderr[-2000:])
