"""Isolation between concurrent sandboxes and from the host, and stdout judged with LiveCodeBench's number semantics.

Each attack goes through the public `CodeReward` (or `Sandbox`), with the runner's audit hook and without it, so the
OS layer (seccomp filter, cgroups) is shown to hold on its own; a program prints the expected answer only if its attack
worked, and where a host-side check exists (the vsock port) it does not depend on the program telling the truth.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from riskpo_trl.code import cgroups, seccomp
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits, fallback_statement, program_cgroups
from riskpo_trl.code.stdout_compare import stdout_matches, tokens_match
from riskpo_trl.code.testspec import TestSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_INIT = ROOT / "riskpo_trl" / "__init__.py"
LIMITS = SandboxLimits(
    test_timeout_s=4.0,
    total_timeout_s=8.0,
    cpu_time_s=6,
    memory_mb=512,
    max_output_bytes=1 << 20,
    disk_mb=16,
    max_processes=20,
    max_files=2000,
)
WIN = TestSpec("stdin", [""], ["3"]).to_json()  # a program prints 3 only when its attack worked

# The runner's deny tables are globals of its module, reachable through the call stack: emptying them turns the audit
# hook off, so what stops the rest of a program is the OS layer.
UNHOOK = """
import sys
_frame = sys._getframe()
while "_DENIED_EVENTS" not in _frame.f_globals:
    _frame = _frame.f_back
_frame.f_globals["_DENIED_EVENTS"] = frozenset()
_frame.f_globals["_PATH_ARGS"] = {}
_frame.f_globals["_DIR_FD_ARGS"] = {}
"""
GUARDS = pytest.mark.parametrize("guard", [True, False], ids=["audit_hook", "os_layer_only"])
X86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the program uses x86_64 system call numbers")


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{program}\n```"}]


def score(program: str, spec: str = WIN, guard: bool = True, limits: SandboxLimits = LIMITS) -> float | None:
    reward = CodeReward(sandbox=Sandbox(limits, max_workers=1, audit_guard=guard))
    return reward([as_completion(UNHOOK + textwrap.dedent(program))], [spec])[0]


# --- sockets: AF_UNIX only ------------------------------------------------------------------------------------------


def _host_vsock_port() -> int:
    """A vsock port this host can bind now (skips where the host has no vsock)."""
    if not hasattr(socket, "AF_VSOCK"):
        pytest.skip("this Python has no AF_VSOCK")
    for port in range(47000 + os.getpid() % 1000, 49000):
        try:
            with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as probe:
                probe.bind((socket.VMADDR_CID_ANY, port))
            return port
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                pytest.skip(f"this host has no usable vsock ({exc}): the VM-wide port space is not reachable here")
    pytest.skip("no free vsock port")


@GUARDS
def test_a_program_cannot_take_a_vsock_port_from_the_host(guard):
    """vsock ports are one space for the whole VM (no namespace confines them): while the program runs, the host's own
    bind of the port it tries must keep working."""
    port = _host_vsock_port()
    program = f"""
        import socket, time
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        s.bind((socket.VMADDR_CID_ANY, {port}))
        s.listen(1)
        print(3, flush=True)
        time.sleep(2)
        """
    host_binds: list[int] = []
    done = threading.Event()

    def bind_on_the_host():
        while not done.is_set():
            with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as own:
                try:
                    own.bind((socket.VMADDR_CID_ANY, port))
                    host_binds.append(0)
                except OSError as exc:
                    host_binds.append(exc.errno)
            time.sleep(0.05)

    thread = threading.Thread(target=bind_on_the_host)
    thread.start()
    try:
        result = score(program, guard=guard)
    finally:
        done.set()
        thread.join()
    assert errno.EADDRINUSE not in host_binds and host_binds
    assert result == 0.0


@GUARDS
def test_sockets_of_every_family_are_refused(guard):
    """The runner needs no socket (and its audit hook refuses them all): the filter refuses them without the hook."""
    program = """
        import socket
        families = [socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET,
                    socket.AF_VSOCK, 38, 40]
        opened = []
        for family in families:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
                try:
                    socket.socket(family, kind).close()
                    opened.append((family, kind))
                except OSError:
                    pass
            try:
                socket.socketpair(family)
                opened.append((family, "pair"))
            except OSError:
                pass
        if opened:
            print(3)
        """
    assert score(program, guard=guard) == 0.0


def test_honest_programs_keep_pipes_processes_and_fcntl_flags():
    program = """
        import fcntl, multiprocessing, os
        r, w = os.pipe()
        fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
        os.write(w, b"1")
        queue = multiprocessing.SimpleQueue()
        queue.put(1)
        with multiprocessing.Pool(2) as pool:
            values = pool.map(abs, [-1, -2])
        flags = fcntl.fcntl(r, fcntl.F_GETFL) & os.O_NONBLOCK == os.O_NONBLOCK
        print(int(os.read(r, 1)) + queue.get() + sum(values) - 2 if flags else 0)
        """
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))(
        [as_completion(textwrap.dedent(program))], [TestSpec("stdin", [""], ["3"]).to_json()]
    ) == [1.0]


# --- watching files: inotify, fanotify, dnotify ---------------------------------------------------------------------


@X86_64
@GUARDS
def test_no_watch_on_the_shared_files(guard):
    """inotify on the bound standard library would show which files the trainer and the other sandboxes open."""
    program = """
        import ctypes, fcntl, os
        libc = ctypes.CDLL(None, use_errno=True)
        stdlib = os.path.dirname(os.__file__).encode()
        wins = []
        for number, args in ((253, ()), (294, (0,))):  # inotify_init, inotify_init1
            fd = libc.syscall(number, *args)
            wins.append(fd >= 0 and libc.syscall(254, fd, stdlib, 0x1 | 0x20) >= 0)  # IN_ACCESS | IN_OPEN
        wins.append(libc.syscall(300, 0, 0) >= 0)  # fanotify_init
        try:
            directory = os.open(stdlib, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.fcntl(directory, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
            wins.append(True)
        except OSError:
            pass
        if any(wins):
            print(3)
        """
    assert score(program, guard=guard) == 0.0


# --- file locks: no channel between two sandboxes --------------------------------------------------------------------

LOCK_HOLDER = """
    import fcntl, os, struct, time
    for path in (os.__file__, "/dev/null"):
        f = open(path, "rb")
        for take in (lambda: fcntl.flock(f, fcntl.LOCK_EX), lambda: fcntl.lockf(f, fcntl.LOCK_SH),
                     lambda: fcntl.fcntl(f, 37, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))):  # F_OFD_SETLK
            try:
                take()
            except OSError:
                pass
    time.sleep(3)
    print(0)
    """
LOCK_WATCHER = """
    import fcntl, os, struct, time
    def locked(path):
        f = open(path, "rb")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
        except BlockingIOError:
            return True
        except OSError:
            pass
        try:  # F_GETLK: would a write lock conflict with someone's lock?
            answer = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
            return struct.unpack("hhqqi", answer)[0] != fcntl.F_UNLCK
        except OSError:
            return False
    end = time.monotonic() + 3
    while time.monotonic() < end:
        if locked(os.__file__) or locked("/dev/null"):
            print(3)
            break
        time.sleep(0.05)
    """


def _signal_through_locks(sandbox_seccomp: bool) -> float:
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=2, audit_guard=False, seccomp=sandbox_seccomp))
    programs = [UNHOOK + textwrap.dedent(LOCK_HOLDER), UNHOOK + textwrap.dedent(LOCK_WATCHER)]
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    return reward([as_completion(program) for program in programs], [spec, spec])[1]


def test_two_concurrent_sandboxes_cannot_signal_each_other_through_file_locks():
    """One sandbox locks a shared read-only file (a standard-library module, /dev/null), the other polls for that lock:
    a one-bit channel between two completions. The seccomp filter refuses every lock call; without it the channel
    is there (the control), so the test shows it can see one."""
    assert _signal_through_locks(sandbox_seccomp=False) == 1.0
    assert _signal_through_locks(sandbox_seccomp=True) == 0.0


def test_the_filter_assembles_for_each_architecture():
    for machine in ("x86_64", "aarch64"):
        program = seccomp.denied_syscalls_filter(machine)
        assert program is not None and len(program) % 8 == 0
    assert seccomp.denied_syscalls_filter("riscv64") is None
    assert {"flock", "inotify_init1", "fanotify_init"} <= set(seccomp.DENIED)


# --- CPU: one run cannot starve another -----------------------------------------------------------------------------

CPU_HOG = """
    import os, time
    for _ in range(16):
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
    time.sleep(60)
    """
HONEST_CPU_WORK = """
    import time
    time.sleep(0.5)  # the neighbour's 16 children are busy by now
    total = 0
    for i in range(9_000_000):
        total += i & 7
    print(total)
    """


@pytest.mark.skipif(
    not program_cgroups().bounds_cpu,
    reason=f"no cpu cgroup here ({program_cgroups().describe()}): CPU time is shared per process",
)
def test_sixteen_busy_setsid_children_cannot_make_a_correct_neighbour_time_out():
    """A hostile completion forks 16 busy children (each in its own session) while a correct one, scored in the same
    batch, needs about 0.6 s of CPU within a 5.5 s test timeout. Shared per process, the correct one would get a
    seventeenth or less of the CPU that is free (on 2 cores, 5 s and more of wall clock: it times out); with a CPU cap
    and fair sharing per run it gets as much as the hostile one, and passes every time."""
    limits = SandboxLimits(
        test_timeout_s=5.5,
        total_timeout_s=7.0,
        cpu_time_s=8,
        memory_mb=512,
        max_output_bytes=1 << 20,
        disk_mb=16,
        max_processes=20,
        max_files=2000,
    )
    reward = CodeReward(sandbox=Sandbox(limits, max_workers=2))
    spec = TestSpec("stdin", [""], [str(sum(i & 7 for i in range(9_000_000)))]).to_json()
    completions = [as_completion(textwrap.dedent(CPU_HOG)), as_completion(textwrap.dedent(HONEST_CPU_WORK))]
    for attempt in range(3):
        assert reward(completions, [spec, spec]) == [0.0, 1.0], attempt


def test_cpu_caps_on_cgroup_v1_and_an_honest_fallback_without_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (tmp_path / "cgroup").write_text("1:cpu,cpuacct:/\n")
    (tmp_path / "mountinfo").write_text(f"1 1 0:1 / {cpu} rw - cgroup cgroup rw,cpu,cpuacct\n")
    support = cgroups.detect(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    assert support.bounds_cpu and "cpu (cgroup v1)" in support.describe()
    parent = cpu / cgroups.parent_name()
    assert (parent / "cpu.shares").read_text() == str(1024 * (os.cpu_count() or 1))
    run = support.create(32 << 20, 4)
    assert os.path.dirname(run.paths[0]) == str(parent)
    quota = {name: (Path(run.paths[0]) / name).read_text() for name in ("cpu.cfs_period_us", "cpu.cfs_quota_us")}
    assert quota == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
    assert "CPU time is shared per process" not in (fallback_statement(support) or "")

    root = tmp_path / "unified"
    (root / "trainer").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("memory pids\n")  # cpu not delegated
    (tmp_path / "mountinfo").write_text(f"1 1 0:1 / {root} rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup").write_text("0::/trainer\n")
    no_cpu = cgroups.detect(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    assert no_cpu.bounds_memory and no_cpu.bounds_processes and not no_cpu.bounds_cpu
    assert "does not offer or delegate cpu" in no_cpu.missing["cpu"]
    assert "CPU time is shared per process, not per run" in fallback_statement(no_cpu)


def test_a_v1_quota_above_an_ancestors_is_left_to_the_ancestor(tmp_path, monkeypatch):
    """cgroup v1 refuses (EINVAL) a quota above an ancestor's, e.g. a container capped below one core: the run is then
    capped by that ancestor, and starting it must not fail."""
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (tmp_path / "cgroup").write_text("1:cpu:/\n")
    (tmp_path / "mountinfo").write_text(f"1 1 0:1 / {cpu} rw - cgroup cgroup rw,cpu\n")
    support = cgroups.detect(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    real_write = cgroups._write

    def write(path, value):
        if path.endswith("cpu.cfs_quota_us"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_write(path, value)

    monkeypatch.setattr(cgroups, "_write", write)
    run = support.create(32 << 20, 4)
    assert len(run.paths) == 1 and os.path.dirname(run.paths[0]) == str(cpu / cgroups.parent_name())
    assert (Path(run.paths[0]) / "cpu.cfs_period_us").exists()


def test_start_up_warns_once_when_the_cpu_controller_is_missing(monkeypatch, caplog):
    from riskpo_trl.code import sandbox as sandbox_module

    real = program_cgroups()
    without_cpu = cgroups.CgroupSupport(
        hierarchies={k: v for k, v in real.hierarchies.items() if k != "cpu"},
        missing={"cpu": "no cgroup v1 cpu hierarchy is mounted"},
    )
    monkeypatch.setattr(sandbox_module, "program_cgroups", lambda: without_cpu)
    sandbox_module.detect_isolation.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="riskpo_trl.code.sandbox"):
            isolation = Sandbox(LIMITS, max_workers=1).check()
            Sandbox(LIMITS, max_workers=1).check()
    finally:
        sandbox_module.detect_isolation.cache_clear()
    assert "no cgroup for cpu: no cgroup v1 cpu hierarchy is mounted" in isolation.describe()
    messages = [record.getMessage() for record in caplog.records]
    warnings = [message for message in messages if "CPU time is shared per process" in message]
    assert len(warnings) == 1 and "no cgroup for cpu" in warnings[0]


# --- stdout: LiveCodeBench's semantics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ("0.50\n", "0.5"),
        ("3.0000000000", "3.0"),
        ("1e3", "1000"),
        ("-0", "0"),
        ("1 2\n3", "1  2 \r\n3\n\n"),
        ("Case #1: 0.50", "Case #1: 0.5"),
        ("nan", "nan"),
        ("Yes\n", "Yes"),
        ("", "\n"),
        ("a\n\nb", "a\n \nb"),
        ("inf", "Infinity"),
        ("10", "1_0"),
    ],
)
def test_stdout_that_matches(observed, expected):
    assert stdout_matches(observed, expected)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ("0.5000001", "0.5"),
        ("1 2", "1 2 3"),
        ("1\n2", "1 2"),
        ("a\n\nb", "a\nb"),
        ("yes", "Yes"),
        ("nan", "NaN"),
        ("0x10", "16"),
        ("1.", "1.0.0"),
        ("3", ""),
        ("sNaN", "snan"),
        ("1e99999999999999999999", "1e99999999999999999999x"),  # an exponent too large for Decimal: not a number
    ],
)
def test_stdout_that_does_not_match(observed, expected):
    assert not stdout_matches(observed, expected)


def test_a_token_is_a_number_only_when_both_sides_are():
    assert tokens_match("2.50", "2.5") and not tokens_match("2.5", "2.5x") and not tokens_match("NaN", "nan")


def test_numbers_printed_differently_score_one_through_the_reward():
    program = "n = int(input())\nprint(f'{n / 2:.2f}')\nprint(f'{n:.10f}')\n"
    spec = TestSpec("stdin", ["1\n"], ["0.5\n1.0\n"]).to_json()
    wrong = TestSpec("stdin", ["1\n"], ["0.51\n1.0\n"]).to_json()
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))
    assert reward([as_completion(program)] * 2, [spec, wrong]) == [1.0, 0.0]


def test_comparing_is_linear_in_the_output():
    """Work grows with the output, not faster: 16 x the output costs well under 64 x the time (quadratic: 256 x).
    Medians of 3, side by side, on numbers that differ in form (so every token is parsed)."""

    def seconds(lines: int) -> float:
        observed, expected = "\n".join(["0.50 1e3"] * lines), "\n".join(["0.5 1000"] * lines)
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            assert stdout_matches(observed, expected)
            runs.append(time.perf_counter() - start)
        return sorted(runs)[1]

    small, large = seconds(5_000), seconds(80_000)
    assert large < 64 * small
    digits = "1" + "0" * 2_000_000  # one huge token: parsed once, compared once
    start = time.perf_counter()
    assert stdout_matches(digits, "1e2000000") and not stdout_matches(digits, "1e1999999")
    assert time.perf_counter() - start < 5.0


# --- the staging server: each run's working directory, mounted and unmounted with system calls ---------------------

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the staging namespace exists only when the trainer is root")


def _work_mounts(pid: int) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as mounts:
        return [line for line in mounts if " riskpo-work " in line]


@ROOT_ONLY
def test_each_run_gets_a_capped_working_directory_that_is_gone_afterwards():
    from riskpo_trl.code.sandbox import _find_bwrap, _launcher, detect_isolation

    detect_isolation()
    holder = _launcher(_find_bwrap())._holder
    before = len(_work_mounts(holder.pid))  # other tests' sandboxes may hold theirs
    sandbox = Sandbox(LIMITS, max_workers=2)
    program = textwrap.dedent("""
        import os, shutil
        os.makedirs("left-by-a-run")  # fails if an earlier run's directory were still here
        print(shutil.disk_usage(".").total // (1 << 20), oct(os.stat(".").st_mode & 0o777))
    """)
    results = [sandbox.run(program, [""]) for _ in range(3)]
    # each run starts empty, in a tmpfs of disk_mb (its /dev/shm shares it), owned by the run and closed to others
    assert [r.outputs for r in results] == [["16 0o700\n"]] * 3, results
    # while open, a sandbox keeps one run's directory ready per worker slot it used: no more
    assert len(_work_mounts(holder.pid)) <= before + 2
    sandbox.close()
    assert len(_work_mounts(holder.pid)) == before


@ROOT_ONLY
def test_a_forked_trainer_process_gets_its_own_staging_server():
    """Two processes never share one request pipe: a child forked after the first run starts a server of its own in
    the same namespace, and the parent's keeps working."""
    from riskpo_trl.code.sandbox import _find_bwrap, _launcher

    sandbox = Sandbox(LIMITS, max_workers=1)
    assert sandbox.run("print(input())", ["first\n"]).outputs == ["first\n"]
    launcher = _launcher(_find_bwrap())
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            result = sandbox.run("print(input())", ["child\n"])
            ours = launcher._servers[os.getpid()]
            if result.outputs == ["child\n"] and ours is not launcher._holder:
                code = 0
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    assert os.read(read, 1) == b"\x00"
    os.close(read)
    assert os.waitpid(child, 0)[1] == 0
    assert sandbox.run("print(input())", ["again\n"]).outputs == ["again\n"]
    sandbox.close()


@ROOT_ONLY
def test_a_staging_server_that_died_is_a_clear_error_not_a_hang():
    from riskpo_trl.code.bwrap import BwrapLauncher, SandboxUnavailableError
    from riskpo_trl.code.sandbox import _find_bwrap

    launcher = BwrapLauncher(_find_bwrap())
    try:
        launcher.unmount_workdir(launcher.mount_workdir(0, 1 << 20, 64))
        launcher._holder.process.kill()
        launcher._holder.process.wait()
        start = time.monotonic()
        with pytest.raises(SandboxUnavailableError, match="staging server"):
            launcher.mount_workdir(0, 1 << 20, 64)
        assert time.monotonic() - start < 5
    finally:
        launcher.close()
    assert not os.path.exists(launcher.stage_dir)


@ROOT_ONLY
def test_sandboxes_made_ready_ahead_are_freed_with_their_sandbox():
    """Each run leaves its slot's next sandbox ready (bwrap held on its option pipe, in its own cgroups, its working
    directory mounted). Dropping the Sandbox frees them: no process, mount or cgroup is left."""
    import gc

    from riskpo_trl.code.sandbox import _find_bwrap, _launcher, detect_isolation

    detect_isolation()
    holder = _launcher(_find_bwrap())._holder
    mounts_before = len(_work_mounts(holder.pid))
    sandbox = Sandbox(LIMITS, max_workers=1)
    assert sandbox.run("print(input())", ["x\n"]).outputs == ["x\n"]
    ahead = sandbox._ahead
    ready = ahead._pending[0].result(timeout=30)
    pid, cgroup_dirs = ready.start.process.pid, list(ready.cgroup.paths if ready.cgroup else [])
    assert ready.usable() and os.path.exists(f"/proc/{pid}")
    # a held bwrap has started nothing: its options (and so the program) arrive only when a run releases it
    children = f"/proc/{pid}/task/{pid}/children"
    if os.path.exists(children):  # kernels built with CONFIG_PROC_CHILDREN
        with open(children) as listed:
            assert listed.read().strip() == ""
    del sandbox, ready
    gc.collect()
    deadline = time.monotonic() + 10
    while (
        os.path.exists(f"/proc/{pid}") or len(_work_mounts(holder.pid)) > mounts_before
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")
    assert len(_work_mounts(holder.pid)) == mounts_before
    # their cgroups hold no process: removed, or kept empty for the next run (see the next test)
    for path in cgroup_dirs:
        if os.path.exists(path):
            with open(os.path.join(path, "cgroup.procs")) as procs:
                assert procs.read().strip() == ""


@ROOT_ONLY
def test_run_cgroups_are_reused_only_once_empty_and_do_not_pile_up():
    """Each run's cgroups come back emptied and serve a later run: many runs leave no more cgroup directories than
    the sandboxes running or ready at once, and none of those holds a process."""
    support = program_cgroups()
    if not support.hierarchies:
        pytest.skip("no cgroup controller here")
    parents = {hierarchy.parent for hierarchy in support.hierarchies.values()}

    def run_dirs():
        return {entry.path for parent in parents for entry in os.scandir(parent) if entry.is_dir()}

    sandbox = Sandbox(LIMITS, max_workers=2)
    program = "print(sum(range(10**5)))"
    before = run_dirs()
    for _ in range(3):
        results = list(ThreadPoolExecutor(2).map(lambda _: sandbox.run(program, [""]), range(6)))
        assert all(r.ok for r in results), results
    made = run_dirs() - before
    # per worker slot: one cgroup per controller for the running sandbox and one for the one made ready ahead
    assert len(made) <= 2 * 2 * len(support.hierarchies), made
    sandbox.close()
    for path in run_dirs():
        with open(os.path.join(path, "cgroup.procs")) as procs:
            assert procs.read().strip() == "", path


@ROOT_ONLY
def test_a_run_cgroup_that_still_holds_a_process_is_never_reused():
    import subprocess

    support = program_cgroups()
    if not support.hierarchies:
        pytest.skip("no cgroup controller here")
    caps = (48 << 20, 5)  # caps no other test uses, so the pool for them starts empty
    run = support.acquire(*caps)
    straggler = subprocess.Popen(["sleep", "30"])
    try:
        run.add(straggler.pid)
        paths = list(run.paths)
        support.release(run)  # not empty: removed (it cannot be, while the process lives), not pooled
        again = support.acquire(*caps)
        assert set(again.paths).isdisjoint(paths)
        support.release(again)
        reused = support.acquire(*caps)
        assert reused.paths == again.paths  # an emptied one is reused
        support.release(reused)
    finally:
        straggler.kill()
        straggler.wait()
        for path in paths:
            try:
                os.rmdir(path)
            except OSError:
                pass


def _identity_of(process) -> dict:
    out = process.communicate(timeout=30)[0].decode()
    status = dict(line.split(":", 1) for line in out.splitlines() if ":" in line and not line.startswith("ns "))
    namespaces = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("ns "))
    return {
        "uid": status["Uid"].split(),
        "gid": status["Gid"].split(),
        "groups": status["Groups"].split(),
        "caps": status["CapEff"].strip(),
        **namespaces,
    }


IDENTITY = [
    "/bin/sh",
    "-c",
    (
        "grep -E '^(Uid|Gid|Groups|CapEff):' /proc/self/status; "
        "for n in mnt net; do echo ns $n $(readlink /proc/self/ns/$n); done"
    ),
]


@ROOT_ONLY
@pytest.mark.parametrize("spawner", [True, False], ids=["spawner-thread", "nsenter"])
def test_bwrap_starts_as_the_slot_uid_in_the_staging_namespaces(spawner, monkeypatch):
    """As root, bwrap starts as the worker slot's unprivileged uid and gid, with no groups and no capabilities, in the
    staging server's mount and network namespaces: from a thread that joined them (no nsenter), or through nsenter
    where that thread cannot exist. The trainer's own threads keep their root identity and namespaces."""
    import subprocess

    from riskpo_trl.code import spawner as spawner_module
    from riskpo_trl.code.bwrap import SANDBOX_UID_BASE, BwrapLauncher
    from riskpo_trl.code.sandbox import _find_bwrap

    if not spawner:
        monkeypatch.setattr(spawner_module, "_CREDENTIAL_CALLS", {})
    libc = ctypes.CDLL(None)
    dumpable = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    launcher = BwrapLauncher(_find_bwrap())
    try:
        assert (launcher._spawner() is not None) == spawner
        found = _identity_of(launcher.popen(IDENTITY, 3, stdout=subprocess.PIPE, cwd="/"))
        uid = str(SANDBOX_UID_BASE + 3)
        assert found["uid"] == [uid] * 4 and found["gid"] == [uid] * 4, found
        assert found["groups"] == [] and int(found["caps"], 16) == 0, found
        holder = launcher._holder.pid
        assert found["mnt"] == os.readlink(f"/proc/{holder}/ns/mnt")
        assert found["net"] == os.readlink(f"/proc/{holder}/ns/net")
        # this thread, and so the trainer, is untouched
        assert os.getuid() == 0 and os.geteuid() == 0 and 0 in os.getgroups() + [os.getgid()]
        assert os.readlink("/proc/thread-self/ns/mnt") != found["mnt"]
        assert os.readlink("/proc/thread-self/ns/net") != found["net"]
        # and the spawner thread went back to root: a second start works the same
        again = _identity_of(launcher.popen(IDENTITY, 4, stdout=subprocess.PIPE, cwd="/"))
        assert again["uid"] == [str(SANDBOX_UID_BASE + 4)] * 4
        # the process stays dumpable (a change of effective uid clears that for all threads), and every thread of it
        # has its full identity back
        assert libc.prctl(3, 0, 0, 0, 0) == dumpable
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as status:
                fields = dict(line.split(":", 1) for line in status)
            assert fields["Uid"].split() == ["0"] * 4 and fields["Gid"].split() == ["0"] * 4, tid
            assert fields["CapEff"] == fields["CapPrm"], tid
    finally:
        launcher.close()


@ROOT_ONLY
def test_runs_share_a_network_namespace_only_where_the_filter_refuses_sockets():
    """As root with the seccomp filter, every run sits in the staging server's network namespace (no interface up),
    made once; without the filter each run makes one of its own."""
    from riskpo_trl.code.sandbox import _find_bwrap, _launcher, detect_isolation

    if not detect_isolation().seccomp:
        pytest.skip("no seccomp filter for this architecture")
    shared = os.readlink(f"/proc/{_launcher(_find_bwrap())._holder.pid}/ns/net")
    program = "import os; print(os.readlink('/proc/self/ns/net'))"
    filtered, unfiltered = Sandbox(LIMITS, max_workers=1), Sandbox(LIMITS, max_workers=1, seccomp=False)
    try:
        assert [filtered.run(program, [""]).outputs for _ in range(2)] == [[shared + "\n"]] * 2
        own = [unfiltered.run(program, [""]).outputs[0].strip() for _ in range(2)]
        assert shared not in own, own
        assert os.readlink("/proc/self/ns/net") not in own
    finally:
        filtered.close()
        unfiltered.close()


# --- a private TMPDIR (per-job temp directories of mode 0700, common on clusters) ----------------------------------

PRIVATE_TMPDIR_TRAINER = textwrap.dedent("""
    import json, os, sys, tempfile
    sys.path.insert(0, sys.argv[1])
    from riskpo_trl.code import CodeReward, Sandbox, SandboxLimits, TestSpec
    from riskpo_trl.code.sandbox import _find_bwrap, _launcher

    reward = CodeReward(sandbox=Sandbox(SandboxLimits(total_timeout_s=20), max_workers=2))
    spec = TestSpec("stdin", ["2 3\\n"], ["5"]).to_json()
    programs = ["a, b = map(int, input().split())\\nprint(a + b)",
                "import os, tempfile\\nwith tempfile.TemporaryDirectory() as d:\\n    print(len(os.listdir(d)) + 5)",
                "print(6)"]
    scores = reward([[{"role": "assistant", "content": f"```python\\n{p}\\n```"}] for p in programs], [spec] * 3)
    reward.sandbox.close()
    stage = _launcher(_find_bwrap()).stage_dir
    print(json.dumps({"scores": scores, "tmpdir": tempfile.gettempdir(), "stage": stage, "uid": os.geteuid()}))
    """)


def _run_with_a_private_tmpdir(tmpdir: str, python: str, user: int | None = None) -> dict:
    """What a trainer started with ``TMPDIR=tmpdir`` reports (as ``user`` when given); it must exit cleanly."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": tmpdir, "HOME": tmpdir}
    done = subprocess.run(
        [python, "-c", PRIVATE_TMPDIR_TRAINER, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        cwd="/",
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@ROOT_ONLY
def test_a_private_tmpdir_as_root_scores_an_honest_program_and_leaves_nothing_behind():
    tmpdir = tempfile.mkdtemp(prefix="riskpo-private-tmpdir-")  # 0700, root's: the sandbox uid cannot enter it
    try:
        report = _run_with_a_private_tmpdir(tmpdir, sys.executable)
        assert report["scores"] == [1.0, 1.0, 0.0] and report["tmpdir"] == tmpdir and report["uid"] == 0
        assert not report["stage"].startswith(tmpdir + "/")  # staged where the sandbox uid can enter
        assert not os.path.exists(report["stage"])  # removed at exit, as before
        assert os.listdir(tmpdir) == []
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _python_for(uid: int) -> str | None:
    """An interpreter of this Python's version (or the system's python3, 3.10 or later) that ``uid`` can run, or
    None. The code layer needs the standard library only."""
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3", path="/usr/bin:/bin")):
        try:
            if (
                candidate
                and subprocess.run(
                    [candidate, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                    user=uid,
                    group=uid,
                    extra_groups=[],
                    capture_output=True,
                ).returncode
                == 0
            ):
                return candidate
        except OSError:  # not executable by uid
            continue
    return None


@ROOT_ONLY
def test_a_private_tmpdir_without_root_scores_an_honest_program_and_leaves_nothing_behind():
    """The trainer as user nobody, whose TMPDIR is a 0700 directory of its own: bwrap runs as nobody, so nothing
    needs another uid to enter it; the sandbox still works and nothing is left there."""
    nobody = 65534
    python = _python_for(nobody)
    readable = (
        subprocess.run(
            ["/bin/sh", "-c", f"test -r '{PACKAGE_INIT}'"], user=nobody, group=nobody, extra_groups=[]
        ).returncode
        == 0
    )
    namespaces = (
        subprocess.run(
            [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"],
            user=nobody,
            group=nobody,
            extra_groups=[],
            capture_output=True,
        ).returncode
        == 0
    )
    if python is None or not readable or not namespaces:
        pytest.skip(
            f"user nobody cannot run this test here (an interpreter: {python}, the package readable: "
            f"{readable}, unprivileged user namespaces: {namespaces})"
        )
    tmpdir = tempfile.mkdtemp(prefix="riskpo-private-tmpdir-", dir="/tmp")
    os.chown(tmpdir, nobody, nobody)
    try:
        report = _run_with_a_private_tmpdir(tmpdir, python, user=nobody)
        assert report["scores"] == [1.0, 1.0, 0.0] and report["tmpdir"] == tmpdir and report["uid"] == nobody
        assert report["stage"] is None  # no staging namespace without root
        assert os.listdir(tmpdir) == []
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_without_a_temp_directory_others_can_enter_root_is_told_what_to_fix(tmp_path, monkeypatch):
    from riskpo_trl.code import bwrap

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setattr(bwrap, "STAGE_PARENTS", (str(private),))
    with pytest.raises(bwrap.SandboxUnavailableError, match="Point TMPDIR at a directory with mode 755 or 1777"):
        bwrap.stage_parent()
    monkeypatch.setattr(bwrap, "STAGE_PARENTS", ("/tmp",))
    assert bwrap.stage_parent() == "/tmp"
