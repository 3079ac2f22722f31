"""A trainer that forks (DataLoader workers with the fork start method, ``datasets.map(num_proc=...)``) still scores
honest programs 1.0 at once: no pipe of a sandbox made ready ahead survives into the forked child, where it would keep
the held bwrap from ever reading its options. A run whose sandbox cannot start is unscorable (None), never 0.0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import pytest

from riskpo_trl.code import fork_safe
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec

LIMITS = SandboxLimits(
    test_timeout_s=4.0, total_timeout_s=20.0, cpu_time_s=5, memory_mb=512, max_output_bytes=1 << 20, disk_mb=16
)
ADD = [{"role": "assistant", "content": "```python\na, b = map(int, input().split())\nprint(a + b)\n```"}]
SPEC = TestSpec("stdin", ["1 2\n"], ["3\n"]).to_json()


@pytest.fixture
def reward():
    sandbox = Sandbox(LIMITS, max_workers=2)
    yield CodeReward(sandbox=sandbox)
    sandbox.close()


def fds_of(pid: int) -> set[str]:
    """What each open descriptor of ``pid`` points at (pipe:[inode], a path...)."""
    found = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return found


def held_targets() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in fork_safe.held()} - {os.devnull}


class SlowRows:
    """A map-style dataset whose worker stays alive (and forked) while the test scores."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        time.sleep(0.5)
        return {"worker": os.getpid()}


def test_honest_programs_score_one_while_a_dataloader_worker_is_forked(reward):
    torch_data = pytest.importorskip("torch.utils.data")
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]  # the next runs' sandboxes are now ready, held
    held = held_targets()
    assert any(target.startswith("pipe:") for target in held)
    loader = torch_data.DataLoader(
        SlowRows(), batch_size=None, num_workers=1, multiprocessing_context="fork", persistent_workers=True
    )
    rows = iter(loader)
    worker = int(next(rows)["worker"])
    assert worker != os.getpid()
    assert not held & fds_of(worker), "a ready sandbox's descriptor survived into the forked worker"
    start = time.monotonic()
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]
    assert time.monotonic() - start < LIMITS.total_timeout_s / 2
    del rows, loader


def test_no_ready_sandbox_descriptor_reaches_datasets_map_workers(reward):
    datasets = pytest.importorskip("datasets")
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]
    held = held_targets()
    assert held

    def leaked(row):
        return {"pid": os.getpid(), "leaked": sorted(held & fds_of(os.getpid()))}

    mapped = datasets.Dataset.from_dict({"x": list(range(8))}).map(leaked, num_proc=2)
    assert os.getpid() not in mapped["pid"]  # the map ran in forked processes
    assert not any(mapped["leaked"])
    start = time.monotonic()
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]
    assert time.monotonic() - start < LIMITS.total_timeout_s / 2


def test_a_forked_child_does_not_use_the_parents_ready_sandboxes(reward):
    """The child runs its own sandboxes (and frees them); the parent's ready ones still serve the parent."""
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child scores too, then exits without running the parent's clean-up
        try:
            os.write(write, b"%r" % reward([ADD], [SPEC]))
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as child:
        assert child.read() == b"[1.0]"
    assert reward([ADD, ADD], [SPEC] * 2) == [1.0, 1.0]


@pytest.fixture
def failing_bwrap():
    """A bwrap that exits before starting any sandbox, where the sandbox uids can run it."""
    directory = tempfile.mkdtemp()
    os.chmod(directory, 0o755)
    fake = os.path.join(directory, "bwrap")
    with open(fake, "w") as file:
        file.write("#!/bin/sh\nexit 1\n")
    os.chmod(fake, 0o755)
    yield fake
    shutil.rmtree(directory)


def test_a_sandbox_that_cannot_start_is_unscorable_not_zero(failing_bwrap):
    isolation = Sandbox(LIMITS).check()
    sandbox = Sandbox(LIMITS, max_workers=2, isolation=replace(isolation, bwrap=failing_bwrap))
    try:
        start = time.monotonic()
        assert CodeReward(sandbox=sandbox)([ADD, ADD], [SPEC] * 2) == [None, None]
        assert time.monotonic() - start < LIMITS.total_timeout_s / 2
    finally:
        sandbox.close()


TRAINER = """
import os, sys, time
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits, program_cgroups
from riskpo_trl.code.testspec import TestSpec
limits = SandboxLimits(test_timeout_s=4.0, total_timeout_s=20.0, memory_mb=512, disk_mb=16)
reward = CodeReward(sandbox=Sandbox(limits, max_workers=2))
add = [{"role": "assistant", "content": "```python\\nprint(sum(map(int, input().split())))\\n```"}]
print(reward([add, add], [TestSpec("stdin", ["1 2\\n"], ["3\\n"]).to_json()] * 2), flush=True)
if sys.argv[1] == "fork-and-wait":
    if os.fork() == 0:
        time.sleep(2)  # the forked child outlives the trainer
        os._exit(0)
    print("ready", flush=True)
    time.sleep(600)  # until SIGKILLed
"""


def parent_cgroups_of(pid: int) -> list[str]:
    """The sandbox's parent cgroups of trainer ``pid`` in every hierarchy mounted under /sys/fs/cgroup."""
    found = []
    for root, directories, _ in os.walk("/sys/fs/cgroup"):
        if root.count(os.sep) > 6:
            directories.clear()
        found += [os.path.join(root, name) for name in directories if name.startswith(f"riskpo-sandbox-{pid}-")]
    return found


def test_a_sigkilled_trainer_that_had_forked_leaves_nothing_once_the_next_one_starts():
    from riskpo_trl.code.sandbox import program_cgroups

    if not program_cgroups().hierarchies:
        pytest.skip("no cgroups can be made here")
    killed = subprocess.Popen([sys.executable, "-c", TRAINER, "fork-and-wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "[1.0, 1.0]"
        assert killed.stdout.readline().strip() == "ready"
        assert parent_cgroups_of(killed.pid)
    finally:
        killed.kill()
        killed.wait()
    time.sleep(3)  # the forked child exits too
    next_trainer = subprocess.run(
        [sys.executable, "-c", TRAINER, "score"], capture_output=True, text=True, timeout=120
    )
    assert next_trainer.stdout.strip() == "[1.0, 1.0]", next_trainer.stderr[-2000:]
    assert parent_cgroups_of(killed.pid) == []
    leftover = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and f"riskpo-sandbox-{killed.pid}-" in open_text(f"/proc/{pid}/cgroup")
    ]
    assert leftover == []


def open_text(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


ORPHAN = """
import os, sys, time
os.setsid()
if os.fork():
    os._exit(0)  # the orphan's parent becomes PID 1, as a SIGKILLed trainer's bwrap does
os.makedirs(sys.argv[2], exist_ok=True)
with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))  # in a run cgroup named by the trainer of sys.argv[3]
os.setgid(int(sys.argv[1]))
os.setuid(int(sys.argv[1]))
time.sleep(600)
"""


def start_orphan(uid: int, trainer_pid: int) -> tuple[str, str]:
    """A process of sandbox uid ``uid`` whose parent is PID 1, in a run cgroup named by ``trainer_pid``'s parent
    cgroup (what a trainer leaves when SIGKILLed): (its pid, its run cgroup)."""
    from riskpo_trl.code import cgroups
    from riskpo_trl.code.sandbox import program_cgroups

    hierarchy = program_cgroups().hierarchies["memory"]
    run = os.path.join(os.path.dirname(hierarchy.parent), cgroups.parent_name(trainer_pid), "run0")
    subprocess.run([sys.executable, "-c", ORPHAN, str(uid), run, str(trainer_pid)], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (orphans := [p for p in os.listdir("/proc") if p.isdigit() and owner_and_parent(p) == (uid, 1)]):
        assert time.monotonic() < deadline, "the orphan did not start"
        time.sleep(0.05)
    return orphans[0], run


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes run as their own uids only when the trainer is root")
def test_the_next_trainer_kills_only_the_sandbox_processes_of_a_trainer_that_is_gone():
    """Ownership is proven by the run cgroup's name (a trainer of this PID namespace that runs no process), never by
    "the parent is PID 1": a process of a live trainer's cgroup, orphaned or not, is left alone."""
    from riskpo_trl.code.bwrap import SANDBOX_UID_BASE
    from riskpo_trl.code.sandbox import program_cgroups

    if "memory" not in program_cgroups().hierarchies:
        pytest.skip("no memory cgroup can be made here")
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    uid = SANDBOX_UID_BASE + 7
    left_over, left_run = start_orphan(uid, dead_pid.pid)
    live, live_run = start_orphan(uid + 1, os.getpid())  # "owned" by this live process
    try:
        next_trainer = subprocess.run(
            [sys.executable, "-c", TRAINER, "score"], capture_output=True, text=True, timeout=120
        )
        assert next_trainer.stdout.strip() == "[1.0, 1.0]", next_trainer.stderr[-2000:]
        assert owner_and_parent(left_over) is None  # killed
        assert owner_and_parent(live) == (uid + 1, 1)  # its trainer still runs: not provably left over
    finally:
        for pid in (left_over, live):
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
        time.sleep(0.2)
        for run in (left_run, live_run):
            for path in (run, os.path.dirname(run)):
                try:
                    os.rmdir(path)
                except OSError:
                    pass


def owner_and_parent(pid: str) -> tuple[int, int] | None:
    fields = dict(line.split(":", 1) for line in open_text(f"/proc/{pid}/status").splitlines() if ":" in line)
    if "Uid" not in fields or fields.get("State", "").strip().startswith("Z"):
        return None
    return int(fields["Uid"].split()[0]), int(fields["PPid"])
