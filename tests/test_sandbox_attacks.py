"""Hostile programs through the public `CodeReward`: none may forge a pass, escape, survive, or crash the trainer.

Every attack runs twice: with the runner's audit hook (the default) and without it (``audit_guard=False``), so the
bubblewrap layer is shown to hold on its own. Each program prints the expected answer only if its attack worked, so a
reward of 1.0 means a hole; the host-side checks (markers, connections, stray processes, hostname, xattrs, the
stand-in trainer) do not depend on the program telling the truth. Every attack is bounded: small loops, short sleeps,
markers in pytest's temporary directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import uuid

import pytest
from helpers import processes_with

from riskpo_trl.code import bounded_json
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits, fallback_statement, program_cgroups
from riskpo_trl.code.testspec import TestSpec

LIMITS = SandboxLimits(
    test_timeout_s=2.0,
    total_timeout_s=4.0,
    cpu_time_s=3,
    memory_mb=512,
    max_output_bytes=1 << 20,
    disk_mb=16,
    max_processes=8,
    max_files=2000,
)
SECRET_VAR = "RISKPO_FAKE_API_TOKEN"

# The attack on the runner itself: its deny tables are globals of the runner's module, which the call stack leads
# to, so one line empties them. Every escape program starts with it, so that with the audit hook on, what stops the
# rest is the OS layer.
DISARM = """
import sys
_frame = sys._getframe()
while "_DENIED_EVENTS" not in _frame.f_globals:
    _frame = _frame.f_back
_runner = _frame.f_globals
_runner["_DENIED_EVENTS"] = frozenset()
_runner["_PATH_ARGS"] = {}
_runner["_DIR_FD_ARGS"] = {}
"""


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{program}\n```"}]


@pytest.fixture(scope="module")
def secret() -> str:
    return f"riskpo-secret-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def trainer_stand_in(secret):
    """A process standing in for the trainer: the secret in its environment, command line and memory."""
    process = subprocess.Popen(
        [sys.executable, "-c", f"import time\nkept = {secret!r} * 4\ntime.sleep(300)"],
        env={**os.environ, SECRET_VAR: secret},
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def listener():
    """A TCP listener on 127.0.0.1 that records every connection that reaches it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    connections: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connections.append(server.accept()[0])
            except (TimeoutError, OSError):
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], connections
    stop.set()
    thread.join()
    server.close()


def forgery_programs(secret: str, dataset: str, trainer_pid: int, stand_in_pid: int) -> dict[str, str]:
    """Programs that try to print the expected output (the secret) without computing it."""
    scan_prefix = secret[:14]  # "riskpo-secret-"; the rest is what they must find
    return {
        "read the dataset file": f"print(open({dataset!r}).read().strip())",
        "walk the filesystem for the dataset": textwrap.dedent(f"""
            import os
            seen = 0
            for top in ("/", "/home", "/root", "/data", "/mnt", "/srv", "/tmp"):
                for root, dirs, files in os.walk(top):
                    for name in files:
                        seen += 1
                        if seen > 3000:
                            raise SystemExit
                        try:
                            text = open(os.path.join(root, name), errors="ignore").read(1 << 16)
                        except OSError:
                            continue
                        if {scan_prefix!r} in text:
                            at = text.index({scan_prefix!r})
                            print(text[at:at + {len(secret)}])
                            raise SystemExit
            """),
        "environment": f"import os\nprint(os.environ[{SECRET_VAR!r}])",
        "/proc/<pid>/environ and cmdline of every pid": textwrap.dedent(f"""
            import os
            for pid in ["1", "self", {str(trainer_pid)!r}, {str(stand_in_pid)!r}, *os.listdir("/proc")]:
                for part in ("environ", "cmdline"):
                    try:
                        data = open(f"/proc/{{pid}}/{{part}}", "rb").read().decode(errors="ignore")
                    except OSError:
                        continue
                    if {scan_prefix!r} in data:
                        at = data.index({scan_prefix!r})
                        print(data[at:at + {len(secret)}])
                        raise SystemExit
            """),
        "/proc/<trainer>/mem": DISARM
        + textwrap.dedent(f"""
            import os, re
            budget = 64 << 20
            for pid in ({trainer_pid}, {stand_in_pid}, 1, os.getppid()):
                try:
                    maps = open(f"/proc/{{pid}}/maps").read().splitlines()
                    mem = open(f"/proc/{{pid}}/mem", "rb")
                except OSError:
                    continue
                for line in maps:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if "rw" not in line.split()[1] or budget <= 0:
                        continue
                    try:
                        mem.seek(start)
                        chunk = mem.read(min(end - start, budget))
                    except (OSError, OverflowError, ValueError):
                        continue
                    budget -= len(chunk)
                    found = re.search(rb"{scan_prefix}[0-9a-f]{{12}}", chunk)
                    if found:
                        print(found.group().decode())
                        raise SystemExit
            """),
    }


def escape_programs(marker_dir: str, port: int, trainer_pid: int, stand_in_pid: int, token: str) -> dict[str, str]:
    """Programs that print 3 (the expected output) only if their attack on the machine worked."""

    def marker(name: str) -> str:
        return os.path.join(marker_dir, f"marker-{name}")

    write_marker = "open({path!r}, 'w').write('escaped')"
    survivor = (
        f"import time\nfor _ in range(40):\n    time.sleep(0.25)\n{write_marker.format(path=marker('survivor'))}\n"
    )
    return {
        "deny-table rewrite then subprocess": DISARM
        + textwrap.dedent(f"""
            import os, subprocess
            subprocess.run([sys.executable, "-c", {write_marker.format(path=marker("subprocess"))!r}], timeout=2)
            subprocess.run(["/bin/sh", "-c", "echo escaped > {marker("shell")}"], timeout=2)
            if os.path.exists({marker("subprocess")!r}) or os.path.exists({marker("shell")!r}):
                print(3)
            """),
        "_posixsubprocess.fork_exec": textwrap.dedent(f"""
            import _posixsubprocess, os, sys
            errpipe_read, errpipe_write = os.pipe()
            code = {write_marker.format(path=marker("fork_exec"))!r}
            exe = os.fsencode(sys.executable)
            pid = _posixsubprocess.fork_exec(
                [exe, b"-c", code.encode()], [exe], True, (errpipe_write,), None, None,
                -1, -1, -1, -1, -1, -1, errpipe_read, errpipe_write, True, False, -1, None, None, None, -1, None,
                False)
            os.close(errpipe_write)
            os.waitpid(pid, 0)
            if os.path.exists({marker("fork_exec")!r}):
                print(3)
            """),
        "write outside": textwrap.dedent(f"""
            import os, sys
            for path in ({marker("direct")!r}, "/marker", "/usr/marker", "/dev/marker", "/proc/marker",
                         os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "marker")):
                try:
                    open(path, "w").write("escaped")
                    print(3)
                    break
                except OSError:
                    pass
            """),
        "dir_fd opens": DISARM
        + textwrap.dedent(f"""
            import os
            for directory in ({marker_dir!r}, "/", "/usr", "/dev", "/proc/self/cwd/.."):
                try:
                    d = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                    fd = os.open("marker-dir_fd", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)
                    os.write(fd, b"escaped")
                    print(3)
                    break
                except OSError:
                    pass
            """),
        "ctypes syscalls and memory writes": DISARM
        + textwrap.dedent(f"""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            wins = 0
            wins += libc.mount(b"none", b"/usr", b"tmpfs", 0, None) == 0
            wins += libc.unshare(0x10000000) == 0  # CLONE_NEWUSER: a fresh namespace with all capabilities
            wins += libc.ptrace(16, {trainer_pid}, 0, 0) == 0  # PTRACE_ATTACH
            wins += libc.ptrace(16, {stand_in_pid}, 0, 0) == 0
            for pid in ({trainer_pid}, {stand_in_pid}):  # (PID 1 is the sandbox's own bwrap: same uid, no gain)
                try:
                    with open(f"/proc/{{pid}}/mem", "r+b") as mem:
                        mem.seek(0x400000)
                        mem.write(b"\\xcc")
                        wins += 1
                except OSError:
                    pass
            ctypes.memset(ctypes.addressof(ctypes.c_int(0)), 0, 4)  # its own memory: allowed, and harmless
            if wins:
                print(3)
            """),
        "setxattr on the interpreter": textwrap.dedent("""
            import os, sys
            wins = 0
            for path in (os.path.realpath(sys.executable), "/", "/usr"):
                for name in ("user.riskpo", "trusted.riskpo", "security.riskpo"):
                    try:
                        os.setxattr(path, name, b"escaped")
                        wins += 1
                    except OSError:
                        pass
            if wins:
                print(3)
            """),
        "TIOCSTI terminal injection": textwrap.dedent("""
            import fcntl, os, termios
            fds = [0, 1, 2]
            for path in ("/dev/tty", "/dev/console", "/dev/ptmx"):
                try:
                    fds.append(os.open(path, os.O_RDWR))
                except OSError:
                    pass
            for fd in fds:
                try:
                    fcntl.ioctl(fd, termios.TIOCSTI, b"x")
                    print(3)
                    break
                except OSError:
                    pass
            """),
        "sethostname": textwrap.dedent("""
            import socket
            try:
                socket.sethostname("riskpo-pwned")
                print(3)
            except OSError:
                pass
            """),
        "nsenter into the trainer's network namespace": DISARM
        + textwrap.dedent(f"""
            import ctypes, os, socket, subprocess
            libc = ctypes.CDLL(None, use_errno=True)
            for pid in ({trainer_pid}, {stand_in_pid}, 1, "self"):
                try:
                    fd = os.open(f"/proc/{{pid}}/ns/net", os.O_RDONLY)
                    libc.setns(fd, 0)
                except OSError:
                    pass
            try:
                subprocess.run(["nsenter", "-t", "{trainer_pid}", "-n", sys.executable, "-c", "pass"], timeout=2)
            except OSError:
                pass
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"nsenter")
                print(3)
            except OSError:
                pass
            """),
        "loopback network": DISARM
        + textwrap.dedent(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"hello")
                print(3)
            except OSError:
                pass
            try:
                socket.create_connection(("localhost", {port}), timeout=1)
                print(3)
            except OSError:
                pass
            """),
        "kill the trainer": DISARM
        + textwrap.dedent(f"""
            import os, signal
            for pid in ({trainer_pid}, {stand_in_pid}):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print(3)
                except OSError:
                    pass
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal: inside the PID namespace, only itself
            """),
        "setsid survivor without parent-death signal": DISARM
        + textwrap.dedent(f"""
            import ctypes, os, sys
            if os.fork() == 0:
                os.setsid()
                ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG = 0
                if os.fork() == 0:
                    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
                    os.execv(sys.executable, [sys.executable, "-c", {survivor!r}, {token!r}])
                os._exit(0)
            print("parent leaves at once")
            """),
        "setsid survivor of a timed-out run": DISARM
        + textwrap.dedent(f"""
            import ctypes, os, sys
            if os.fork() == 0:
                os.setsid()
                ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
                os.execv(sys.executable, [sys.executable, "-c", {survivor!r}, {token!r}])
            while True:
                pass
            """),
        "fork flood": DISARM
        + textwrap.dedent("""
            import os, time
            made = 0
            for _ in range(200):
                try:
                    if os.fork() == 0:
                        time.sleep(2)
                        os._exit(0)
                    made += 1
                except OSError:
                    break
            if made >= 50:
                print(3)
            """),
        "thread flood": textwrap.dedent("""
            import threading, time
            made = 0
            for _ in range(200):
                try:
                    threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
                    made += 1
                except RuntimeError:
                    break
            if made >= 50:
                print(3)
            """),
        **{
            f"1 GiB write to {directory or 'the working directory'}": textwrap.dedent(f"""
            chunk, written = b"x" * (1 << 20), 0
            for index in range(1024):
                try:
                    with open(f"{directory}blob{{index}}", "wb") as f:
                        f.write(chunk)
                    written += len(chunk)
                except OSError:
                    break
            if written >= 256 << 20:
                print(3)
            """)
            for directory in ("", "/dev/shm/")
        },
        "deep directory tree": textwrap.dedent("""
            import os
            for _ in range(1500):
                os.mkdir("d")
                os.chdir("d")
            """),
    }


def test_forgery_attempts_earn_nothing(trainer_stand_in, secret, tmp_path):
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(secret + "\n")
    spec = TestSpec("stdin", [""], [secret]).to_json()
    programs = forgery_programs(secret, str(dataset), os.getpid(), trainer_stand_in.pid)
    for guard in (True, False):
        reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=4, audit_guard=guard))
        scores = dict(zip(programs, reward([as_completion(p) for p in programs.values()], [spec] * len(programs))))
        assert scores == dict.fromkeys(programs, 0.0), f"audit_guard={guard}"
    honest = CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))
    assert honest([as_completion(f"print({secret!r})")], [spec]) == [1.0]  # the same spec is passable
    assert trainer_stand_in.poll() is None


@pytest.mark.parametrize("guard", [True, False], ids=["audit_hook", "os_layer_only"])
def test_escape_attempts_fail_and_leave_nothing_behind(guard, trainer_stand_in, listener, tmp_path):
    port, connections = listener
    token = f"riskpo-survivor-{uuid.uuid4().hex[:8]}"
    hostname = socket.gethostname()
    executable = os.path.realpath(sys.executable)
    xattrs = os.listxattr(executable)
    programs = escape_programs(str(tmp_path), port, os.getpid(), trainer_stand_in.pid, token)
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=4, audit_guard=guard))
    scores = reward([as_completion(p) for p in programs.values()], [spec] * len(programs))
    assert all(type(score) is float for score in scores)
    assert dict(zip(programs, scores)) == dict.fromkeys(programs, 0.0)
    assert processes_with(token) == []  # the survivors died with their sandbox, before their markers were due
    assert os.listdir(tmp_path) == []
    assert connections == []
    assert socket.gethostname() == hostname and os.listxattr(executable) == xattrs
    assert trainer_stand_in.poll() is None
    time.sleep(0.5)
    assert processes_with(token) == [] and os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="max_files is enforced when the trainer runs as root (see the docs)")
def test_file_flood_stops_at_max_files():
    program = textwrap.dedent("""
        import time
        start, made = time.monotonic(), 0
        while made < 50_000 and time.monotonic() - start < 3:
            try:
                open(f"f{made}", "w").close()
                made += 1
            except OSError:
                break
        print(3 if made >= 5000 else made)
        """)
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    for guard in (True, False):
        sandbox = Sandbox(LIMITS, max_workers=1, audit_guard=guard)
        assert CodeReward(sandbox=sandbox)([as_completion(program)], [spec]) == [0.0]
        made = int(sandbox.run(program, [""]).outputs[0])
        assert LIMITS.max_files - 10 <= made < LIMITS.max_files  # the runner's stdin/stdout files take two


def _forged_report(payload: str) -> str:
    """A program that writes ``payload`` (a Python expression for bytes) to every fd: the runner's report pipe too."""
    return textwrap.dedent(f"""
        import os
        data = {payload}
        for fd in range(1, 32):
            try:
                os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
        """)


def _output_attack_specs() -> list[tuple[str, str, str]]:
    """(name, program, TestSpec JSON) of programs whose output or report is built to crash the grader."""
    functional = TestSpec("functional", ["1"], ["1.5"], fn_name="f").to_json()
    integer = TestSpec("functional", ["1"], ["1"], fn_name="f").to_json()
    assert_style = TestSpec("assert", ["assert f(1) == 2\nassert f(2) < 3"], [""]).to_json()
    stdin = TestSpec("stdin", [""], ["3"]).to_json()
    return [
        ("10**400 vs a float", "def f(x):\n    return 10 ** 400", functional),
        ("10**400 vs an int", "def f(x):\n    return 10 ** 400", integer),
        ("-10**400 in an ordering assertion", "def f(x):\n    return -10 ** 400", assert_style),
        ("nan", "def f(x):\n    return float('nan')", functional),
        ("inf", "def f(x):\n    return float('inf')", functional),
        (
            "3000-deep list",
            "def f(x):\n    v = []\n    for _ in range(3000):\n        v = [v]\n    return v",
            functional,
        ),
        (
            "forged deep report",
            _forged_report('b\'{"outputs": ["\' + b"[" * 3000 + b"1" + b"]" * 3000 + b\'"], "error": null}\\n\''),
            functional,
        ),
        (
            "forged deep assert records",
            _forged_report('b\'{"outputs": ["\' + b"[" * 3000 + b\'"], "error": null}\\n\''),
            assert_style,
        ),
        ("[ x 100,000 as the report", _forged_report('b"[" * 100_000 + b"\\n"'), stdin),
        ("junk bytes as the report", _forged_report('bytes(range(256)) * 64 + b"\\n"'), stdin),
        ("a record claiming 10**20 bytes", _forged_report('b"O" + b"9" * 20 + b"\\n3D0\\n"'), stdin),
        ("two outputs for one test", _forged_report('b"O1\\n3O1\\n3D0\\n"'), stdin),
        (
            "forged huge-int report",
            _forged_report('b\'{"outputs": ["\' + b"9" * 5000 + b\'"], "error": null}\\n\''),
            integer,
        ),
        ("huge stdout", "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 16))", stdin),
    ]


def test_hostile_outputs_score_zero_and_never_raise():
    specs = _output_attack_specs()
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=4))
    scores = reward([as_completion(program) for _, program, _ in specs], [spec for _, _, spec in specs])
    assert dict(zip([name for name, _, _ in specs], scores)) == {name: 0.0 for name, _, _ in specs}


# --- the red team's findings, each as an attack that must fail -------------------------------------------------------


def _score_both_guards(
    program: str, spec: str, limits: SandboxLimits = LIMITS, seccomp: bool = True
) -> dict[bool, float]:
    """The program's score with the audit hook and without it."""
    return {
        guard: CodeReward(sandbox=Sandbox(limits, max_workers=1, audit_guard=guard, seccomp=seccomp))(
            [as_completion(program)], [spec]
        )[0]
        for guard in (True, False)
    }


def test_the_trainers_own_environment_is_not_readable_inside(monkeypatch, secret):
    """The launching process's environment (HF_TOKEN, WANDB_API_KEY...) reaches no process of the sandbox."""
    monkeypatch.setenv(SECRET_VAR, secret)
    program = DISARM + textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        found = b""
        for pid in ["1", "self", *os.listdir("/proc")]:
            for part in ("environ", "cmdline"):
                fd = libc.open(f"/proc/{{pid}}/{{part}}".encode(), os.O_RDONLY)
                if fd < 0:
                    continue
                buffer = ctypes.create_string_buffer(1 << 16)
                size = libc.read(fd, buffer, 1 << 16)
                libc.close(fd)
                if size > 0:
                    found += buffer.raw[:size] + b"\\0"
        for entry in found.split(b"\\0"):
            if entry.startswith({SECRET_VAR.encode()!r} + b"="):
                print(entry.split(b"=", 1)[1].decode())
                break
        """)
    spec = TestSpec("stdin", [""], [secret]).to_json()
    assert _score_both_guards(program, spec) == {True: 0.0, False: 0.0}
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))([as_completion(f"print({secret!r})")], [spec]) == [1.0]


@pytest.mark.parametrize(
    "program, spec",
    [
        (_forged_report("b'\"' + b'\\\\' * (48 << 20)"), TestSpec("stdin", [""], ["3"]).to_json()),
        ("import sys\nsys.stdout.write('a\\n' * (32 << 20))", TestSpec("stdin", [""], ["3"]).to_json()),
        (
            "def f(x):\n    return list(range(3_000_000))",
            TestSpec("functional", ["1"], ["[1, 2]"], fn_name="f").to_json(),
        ),
    ],
    ids=["48 MB of backslashes as the report", "64 MB of a-newlines on stdout", "a 3-million-item return value"],
)
def test_huge_reports_are_refused_unread_within_the_timeout(program, spec):
    """A report is read only up to what the expected outputs allow; the trainer's memory stays small and judging ends
    within the run's timeout plus a constant."""
    limits = dataclasses.replace(LIMITS, max_output_bytes=64 << 20, memory_mb=1024, disk_mb=128)
    reward = CodeReward(sandbox=Sandbox(limits, max_workers=1))
    tracemalloc.start()
    try:
        start = time.monotonic()
        assert reward([as_completion(program)], [spec]) == [0.0]
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"the trainer held {peak >> 20} MiB judging it"
    assert elapsed < limits.total_timeout_s + 10


def test_report_parsing_uses_no_backtracking():
    """A string of backslashes made the JSON caps' string pattern backtrack: gigabytes and tens of seconds."""
    text = '"' + "\\" * 2_000_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            bounded_json.loads(text, max_bytes=10**8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(text)


MEMORY_LIMITS = dataclasses.replace(
    LIMITS, memory_mb=192, max_output_bytes=64 << 20, test_timeout_s=8.0, total_timeout_s=10.0, cpu_time_s=8
)
needs_memory_cgroup = pytest.mark.skipif(
    not program_cgroups().bounds_memory,
    reason=f"no memory cgroup here ({program_cgroups().describe()}): memory is bounded per process only",
)


@needs_memory_cgroup
@pytest.mark.parametrize(
    "program",
    [
        textwrap.dedent("""
        import os
        children = []
        for _ in range(4):  # each within RLIMIT_AS, together 480 MB
            pid = os.fork()
            if pid == 0:
                block = b"x" * (120 << 20)
                os._exit(0 if len(block) else 1)
            children.append(pid)
        if all(os.waitpid(pid, 0)[1] == 0 for pid in children):
            print(3)
        """),
        DISARM
        + textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        held = 0
        for _ in range(6):  # SysV shared memory: counted by no rlimit once detached (and refused by seccomp)
            segment = libc.shmget(0, 64 << 20, 0o1600)
            address = libc.shmat(segment, None, 0)
            if segment < 0 or address in (None, ctypes.c_void_p(-1).value):
                break
            ctypes.memset(address, 1, 64 << 20)
            libc.shmdt(ctypes.c_void_p(address))
            held += 64
        if held >= 384:
            print(3)
        """),
        textwrap.dedent("""
        import os
        held = []
        try:
            for _ in range(12):  # memfds: counted by no rlimit, and by neither memory_mb nor disk_mb before
                fd = os.memfd_create("blob")
                os.write(fd, b"x" * (60 << 20))
                held.append(fd)
        except OSError:
            pass
        if len(held) == 12:
            print(3)
        """),
    ],
    ids=["4 processes x 120 MB", "SysV shared memory", "memfds"],
)
def test_memory_mb_bounds_the_whole_program(program):
    """The cgroup alone holds (seccomp off: memfds and SysV shared memory reach it), and with the filter too."""
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    for seccomp in (False, True):
        assert _score_both_guards(program, spec, MEMORY_LIMITS, seccomp) == {True: 0.0, False: 0.0}, seccomp


def test_whole_program_caps_are_stated_at_start_up():
    support = program_cgroups()
    isolation = Sandbox(LIMITS).check()
    assert support.describe() in isolation.describe()
    assert (fallback_statement(support) is None) == (support.bounds_memory and support.bounds_processes)


def test_integer_answers_need_integers():
    """A 1e-6 relative float tolerance accepted 123456700.0 for 123456789, and 1e9 for 1000000007."""
    functional = TestSpec("functional", ["1"], ["123456789"], fn_name="f").to_json()
    asserting = TestSpec("assert", ["assert f(1) == 1000000007"], [""]).to_json()
    floats = TestSpec("functional", ["1"], ["2.5"], fn_name="f").to_json()
    cases = [
        ("def f(x):\n    return 123456700.0", functional, 0.0),
        ("def f(x):\n    return 1e9", asserting, 0.0),
        ("def f(x):\n    return 123456789.0", functional, 1.0),  # exactly integral: accepted
        ("def f(x):\n    return 123456789", functional, 1.0),
        ("def f(x):\n    return 1000000007", asserting, 1.0),
        ("def f(x):\n    return 2.5000001", floats, 1.0),
    ]  # float expectations keep their tolerance
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=2))
    scores = reward([as_completion(program) for program, _, _ in cases], [spec for _, spec, _ in cases])
    assert scores == [want for _, _, want in cases]


# A program that rewrites the runner's JSON encoder so that every value an assertion recorded reads as true, equal
# and within tolerance. Before the trainer evaluated assertions itself, that passed these forms with a wrong answer.
FORGER = textwrap.dedent("""
    import json
    _dumps = json.dumps

    def forged(value, *args, **kwargs):
        if isinstance(value, list) and value and all(isinstance(r, list) and len(r) == 2 for r in value):
            value = [[index, [True] * max(2, len(sides))] for index, sides in value]
        return _dumps(value, *args, **kwargs)

    json.dumps = forged

    def f(x):
        return -1
    """)
ASSERT_FORMS = {
    "or": "assert f(2) == 4 or f(2) == 5",
    "math.isclose": "import math\nassert math.isclose(f(2), 4.0)",
    "chained": "assert f(2) == f(2) == 4",
    "loop table": "for x, want in [(2, 4), (3, 9)]:\n    assert f(x) == want",
}


def test_assert_forms_cannot_be_forged_through_the_runner():
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=2))
    specs = [TestSpec("assert", [code], [""]).to_json() for code in ASSERT_FORMS.values()]
    assert reward([as_completion(FORGER)] * len(specs), specs) == [0.0] * len(specs)
    honest = "def f(x):\n    return x * x"
    assert reward([as_completion(honest)] * len(specs), specs) == [1.0] * len(specs)
    for code in ASSERT_FORMS.values():  # the expected values never reach the sandbox
        sandbox_code = TestSpec("assert", [code], [""]).sandbox_inputs()[0]
        assert "4" not in sandbox_code and "9" not in sandbox_code, sandbox_code


UNDECIDABLE = {
    "expected value computed in the check code": "def brute(x):\n    return x * x\nassert f(3) == brute(3)",
    "helper decides": "def close(a, b):\n    return abs(a - b) < 1e-6\nassert close(f(3), 2.5)",
    "assertion behind a loop over computed values": "for x in sorted({3, 1}, key=abs):\n    assert f(x) > 0",
    "assertion behind a while": "i = 0\nwhile i < 2:\n    assert f(i) == i\n    i += 1",
    "no assertion on the program": "f(1)\nassert True",
}


def test_assert_forms_the_trainer_cannot_judge_are_refused_and_counted(tmp_path, caplog):
    from riskpo_trl.code.assertions import UndecidableTestError
    from riskpo_trl.code.data import load_archer_code

    for code in UNDECIDABLE.values():
        with pytest.raises(UndecidableTestError):
            TestSpec("assert", [code], [""])
    rows = [
        {"prompt": "p", "reward_model": {"ground_truth": json.dumps({"functional": code})}}
        for code in [*UNDECIDABLE.values(), "assert f(1) == 1"]
    ]
    path = tmp_path / "archer.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.code.data"):
        dataset = load_archer_code(data_files=str(path))
    assert len(dataset) == 1 and "dropped 5 of 6 rows" in caplog.text
    unjudged = json.dumps({"style": "assert", "inputs": [UNDECIDABLE["helper decides"]], "outputs": [""]})
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))(
        [as_completion("def f(x):\n    return 2.5")], [unjudged]
    ) == [None]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root to run the trainer as PID 1 of a new PID namespace",
)
def test_no_zombie_is_left_when_the_trainer_is_pid_1():
    """In a container without an init, the trainer is PID 1 and reaps nobody: each run's sandbox PID 1 used to stay a
    zombie, until the pid limit made every completion score 0."""
    script = textwrap.dedent("""
        import os
        from riskpo_trl.code.reward import CodeReward
        from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
        from riskpo_trl.code.testspec import TestSpec
        assert os.getpid() == 1
        limits = SandboxLimits(test_timeout_s=4.0, total_timeout_s=8.0)  # room for a loaded machine
        reward = CodeReward(sandbox=Sandbox(limits, max_workers=2))
        spec = TestSpec("stdin", [""], ["3"]).to_json()
        programs = ["print(3)", "while True:\\n    pass", "import os\\nos._exit(0)"] * 2
        scores = reward([[{"role": "assistant", "content": f"```python\\n{p}\\n```"}] for p in programs],
                        [spec] * len(programs))
        def zombies():
            found = []
            for pid in os.listdir("/proc"):
                try:
                    if pid.isdigit() and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.append(pid)
                except OSError:
                    pass
            return found

        import time
        deadline = time.monotonic() + 10  # a judge that exited a moment ago is reaped shortly; a leak stays
        while zombies() and time.monotonic() < deadline:
            time.sleep(0.1)
        print(scores, len(zombies()))
        """)
    done = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[1.0,", "0.0,", "0.0,", "1.0,", "0.0,", "0.0]", "0"]


def test_no_host_path_or_bwrap_argument_is_visible_inside():
    """/proc/1/cmdline showed bwrap's arguments (the staging directory, every bind); no process inside may show the
    trainer's paths."""
    program = textwrap.dedent("""
        import os
        seen = []
        for pid in ["self", *os.listdir("/proc")]:
            for part in ("cmdline", "environ", "mountinfo", "cgroup"):
                try:
                    seen.append(open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        print("\\n".join(seen))
        """)
    result = Sandbox(LIMITS, max_workers=1, audit_guard=False).run(program, [""])
    assert result.ok, result.error
    seen = result.outputs[0]
    assert "python" in seen  # what the program may see: its own interpreter
    for host_detail in ("riskpo-sandbox-stage", "riskpo-sandbox-", "--ro-bind", "--unshare", os.getcwd()):
        assert host_detail not in seen, host_detail


@pytest.mark.parametrize("guard", [True, False], ids=["audit_hook", "os_layer_only"])
def test_seccomp_refuses_ptrace_of_pid_1_and_risky_syscalls(guard):
    program = DISARM + textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        wins = []
        pid = os.fork()
        if pid == 0:  # a child of the runner tries to trace the sandbox's PID 1 (SEIZE: without stopping it)
            traced = libc.ptrace(0x4206, 1, 0, 0) == 0
            libc.ptrace(17, 1, 0, 0)  # PTRACE_DETACH
            os._exit(3 if traced else 0)
        wins.append(os.waitpid(pid, 0)[1] >> 8 == 3)
        calls = {"memfd_create": (319, b"x", 0), "io_uring_setup": (425, 1, ctypes.create_string_buffer(120)),
                 "shmget": (29, 0, 1 << 20, 0o1600), "msgget": (68, 0, 0o1600),
                 "keyctl": (250, 0, -3), "personality": (135, 0x0040000), "userfaultfd": (323, 0),
                 "bpf": (321, 0, 0, 0), "io_setup": (206, 128, ctypes.byref(ctypes.c_ulong(0)))}
        for name, (number, *args) in calls.items():
            wins.append(libc.syscall(number, *args) >= 0)
        seccomp = [line for line in open("/proc/self/status") if line.startswith("Seccomp:")]
        if any(wins) or seccomp != ["Seccomp:\\t2\\n"]:
            print(3)
        """)
    if os.uname().machine != "x86_64":
        pytest.skip("the test uses x86_64 system call numbers")
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1, audit_guard=guard))([as_completion(program)], [spec]) == [
        0.0
    ]


# --- the red team's findings after part 2, parts A, B and D: each through the public CodeReward ----------------------

# A program that reads the expected value from the check code's own variables (the check runs in the program's
# namespace): it forged every loop-table form while rows were bound in the sandbox.
ROW_READER = textwrap.dedent("""
    def f(*args):
        g = globals()
        if isinstance(g.get("tc"), dict):
            return g["tc"]["expected"]
        if isinstance(g.get("case"), tuple):
            return g["case"][1]
        if isinstance(g.get("t"), tuple):
            return g["t"][-1]
        return -1
    """)
LOOP_TABLES = {
    "for t in tests: f(*t[0]) == t[1]": "tests = [((2,), 4), ((3,), 9)]\nfor t in tests:\n    assert f(*t[0]) == t[1]",
    "case = (args, want)": "case = ((2,), 4)\nassert f(*case[0]) == case[1]",
    "t[:-1] / t[-1]": "for t in [(2, 4), (3, 9)]:\n    assert f(*t[:-1]) == t[-1]",
    'dict rows tc["expected"]': (
        'for tc in [{"input": [2], "expected": 4}, {"input": [3], "expected": 9}]:\n'
        '    assert f(*tc["input"]) == tc["expected"]'
    ),
    "x, want = t": "for t in [(2, 4), (3, 9)]:\n    x, want = t\n    assert f(x) == want",
}


@pytest.mark.parametrize("check", LOOP_TABLES.values(), ids=LOOP_TABLES.keys())
def test_loop_table_rows_never_reach_the_sandbox(check):
    spec = TestSpec("assert", [check], [""])
    assert _score_both_guards(ROW_READER, spec.to_json()) == {True: 0.0, False: 0.0}
    honest = "def f(x):\n    return x * x"
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))([as_completion(honest)], [spec.to_json()]) == [1.0]
    assert "4" not in spec.sandbox_inputs()[0] and "9" not in spec.sandbox_inputs()[0], spec.sandbox_inputs()[0]


def test_a_list_the_check_passes_to_the_program_and_compares_with_is_refused():
    """The program could change the expected value in place before it is compared."""
    check = "row = [2, 4]\nassert f(row) == row[1]"
    mutator = "def f(row):\n    row[1] = 0\n    return 0"
    spec = json.dumps({"style": "assert", "inputs": [check], "outputs": [""]})
    assert _score_both_guards(mutator, spec) == {True: None, False: None}


def test_an_isclose_tolerance_is_computed_by_the_trainer_not_the_program():
    check = "import math\nEPS = math.pow(10, -9)\nassert math.isclose(f(2), 4.0, rel_tol=EPS)"
    program = "def f(x):\n    globals()['EPS'] = 1e308\n    return 0.0"
    spec = TestSpec("assert", [check], [""]).to_json()
    assert _score_both_guards(program, spec) == {True: 0.0, False: 0.0}
    honest = "def f(x):\n    return float(x * x)"
    assert CodeReward(sandbox=Sandbox(LIMITS, max_workers=1))([as_completion(honest)], [spec]) == [1.0]


# Checks that fail by something other than an assertion the trainer judges: a program whose answers compare as
# anything (its __ne__ says False) passed them, as long as one real assertion passed.
SANDBOX_DECIDED = {
    "if ...: raise AssertionError": "if f(5) != 25:\n    raise AssertionError\nassert f(1) == 1",
    "unittest assertEqual": (
        "import unittest\ncase = unittest.TestCase()\ncase.assertEqual(f(5), 25)\nassert f(1) == 1"
    ),
    "assertEqual method": (
        "class T:\n    def test(self):\n        self.assertEqual(f(5), 25)\nT().test()\nassert f(1) == 1"
    ),
    "try/except": "try:\n    f(-1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert f(1) == 1",
    "a printed comparison": "print(f(5) == 25)\nassert f(1) == 1",
    "a bare comparison": "f(5) == 25\nassert f(1) == 1",
}
AGREEABLE = textwrap.dedent("""
    class Agreeable(int):
        def __ne__(self, other):
            return False
        __eq__ = lambda self, other: True

    def f(x):
        return 1 if x == 1 else Agreeable(0)
    """)


def test_checks_decided_in_the_sandbox_are_refused_and_counted(tmp_path, caplog):
    from riskpo_trl.code.assertions import UndecidableTestError
    from riskpo_trl.code.data import load_archer_code

    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=2))
    specs = [json.dumps({"style": "assert", "inputs": [code], "outputs": [""]}) for code in SANDBOX_DECIDED.values()]
    assert reward([as_completion(AGREEABLE)] * len(specs), specs) == [None] * len(specs)
    for code in SANDBOX_DECIDED.values():
        with pytest.raises(UndecidableTestError):
            TestSpec("assert", [code], [""])
    rows = [
        {"prompt": "p", "reward_model": {"ground_truth": json.dumps({"functional": code})}}
        for code in [*SANDBOX_DECIDED.values(), "assert f(1) == 1"]
    ]
    path = tmp_path / "archer.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.code.data"):
        assert len(load_archer_code(data_files=str(path))) == 1
    assert f"dropped {len(SANDBOX_DECIDED)} of {len(rows)} rows" in caplog.text


# A trainer of its own per case, so that its CPU time and peak memory measure what judging cost it (the sandboxes and
# judges are its children, counted apart).
FRESH_TRAINER = textwrap.dedent("""
    import inspect, json, resource, sys, time
    from riskpo_trl.code.reward import CodeReward
    from riskpo_trl.code.sandbox import Sandbox, SandboxLimits

    job = json.load(sys.stdin)
    sandbox = Sandbox(SandboxLimits(**job["limits"]), max_workers=len(job["programs"]))
    options = {}
    if "judge_limits" in inspect.signature(CodeReward).parameters:
        from riskpo_trl.code.judge import JudgeLimits
        options["judge_limits"] = JudgeLimits(**job["judge"])
    reward = CodeReward(sandbox=sandbox, **options)
    sandbox.check()

    def peak_mb():  # this process's own high-water mark: ru_maxrss carries the parent's over from before exec
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024

    peak_before = peak_mb()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    completions = [[{"role": "assistant", "content": f"```python\\n{p}\\n```"}] for p in job["programs"]]
    scores = reward(completions, job["tests"])
    elapsed = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"scores": scores, "elapsed": elapsed, "cpu": cpu,
                      "peak_growth_mb": peak_mb() - peak_before}))
    """)
JUDGE = {"timeout_s": 4.0, "cpu_time_s": 3, "memory_mb": 1024}
BOUND_S = LIMITS.total_timeout_s + JUDGE["timeout_s"] + 5  # the run, the judge, and a generous constant


def _judged_in_a_fresh_trainer(programs: list[str], tests: list[str]) -> list[float | None]:
    """Scores of ``programs`` judged at once by a new trainer process; asserts that judging them took that process
    at most the timeouts plus a constant, under 3 s of its own CPU and under 256 MiB more peak memory."""
    job = {"limits": dataclasses.asdict(LIMITS), "judge": JUDGE, "programs": programs, "tests": tests}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_TRAINER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=BOUND_S + 60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["elapsed"] < BOUND_S, result
    assert result["cpu"] < 3.0, result
    assert result["peak_growth_mb"] < 256, result
    return result["scores"]


COLLIDING = "[k * (2**61 - 1) for k in range(1, 38001)]"  # 38,000 ints with one hash: ~900 kB of JSON


def test_colliding_hashes_in_a_report_cost_the_trainer_nothing():
    records = f'("[[0, [" + json.dumps({{"__set__": {COLLIDING}}}) + "]]]").encode()'
    program = "import json\n" + _forged_report(f'b"O%d\\n" % len({records}) + {records} + b"D0\\n"')
    spec = TestSpec("assert", ["assert f(1) == {1, 2}"], [""]).to_json()
    correct = "def f(x):\n    return {2, 1}"  # judged at the same time, while the hostile judge spins
    assert _judged_in_a_fresh_trainer([program, correct], [spec, spec]) == [0.0, 1.0]


def test_a_counter_of_colliding_hashes_neither_freezes_the_trainer_nor_touches_a_neighbour():
    spec = TestSpec("assert", ["assert Counter(f(1)) == Counter([1, 2])"], [""]).to_json()
    hostile, correct = f"def f(x):\n    return {COLLIDING}", "def f(x):\n    return [2, 1]"
    assert _judged_in_a_fresh_trainer([hostile, correct], [spec, spec]) == [0.0, 1.0]


@pytest.mark.parametrize(
    "program, check",
    [
        ('def f(x):\n    return "%0999999999d"', "assert f(1) % 2 == 1"),
        ('def f(x):\n    return "a" * 500_000', 'assert f(1) * 2000 == "x"'),
    ],
    ids=["a %-format string allocating 1 GB", "a program's string times 2000"],
)
def test_values_a_program_returns_cannot_make_the_judge_allocate_in_the_trainer(program, check):
    spec = TestSpec("assert", [check], [""]).to_json()
    assert _judged_in_a_fresh_trainer([program], [spec]) == [0.0]


@pytest.mark.parametrize(
    "check",
    [
        "x = 'ab' * 5 * 10**8\nassert f(1) == len(x)",
        "a = 7 ** 10000\n"
        + "".join(f"{n} = {p} * {p} * {p}\n" for p, n in zip("abcdefg", "bcdefgh"))
        + "assert f(1) == h",
    ],
    ids=["a 1 GB string in the check code", "8 lines of int * int"],
)
def test_dataset_check_code_is_folded_within_bounds(check):
    spec = json.dumps({"style": "assert", "inputs": [check], "outputs": [""]})
    assert _judged_in_a_fresh_trainer(["def f(x):\n    return 0"], [spec]) == [None]


RED_TEAM_CELL = "for i in range(600):\n    for j in range(600):\n        pass\nassert f(1) == 2\n"


def test_nested_literal_loops_in_a_dataset_cell_are_refused_once_by_four_workers_within_bounds():
    """A cell whose loops unroll to 720,600 statements held the trainer for 109 s and 1.97 GB, once per worker that
    scored it; now it is refused before it is built, once, while a neighbouring honest problem scores 1.0."""
    hostile = json.dumps({"style": "assert", "inputs": [RED_TEAM_CELL], "outputs": [""]})
    honest = TestSpec("assert", ["for x, want in [(1, 2), (3, 6)]:\n    assert f(x) == want"], [""]).to_json()
    program = "def f(x):\n    return 2 * x"
    assert _judged_in_a_fresh_trainer([program] * 5, [hostile] * 4 + [honest]) == [None] * 4 + [1.0]


def test_values_over_4300_digits_pass():
    cases = [
        ("def f(x):\n    return 10 ** 5000", TestSpec("functional", ["1"], ["1" + "0" * 5000], fn_name="f")),
        (
            "def f(x):\n    return [x, 10 ** 5000 + x]",
            TestSpec("functional", ["7" * 4500], [f"[{'7' * 4500}, 1{'0' * (5000 - 4500)}{'7' * 4500}]"], fn_name="f"),
        ),
        ("def f(x):\n    return 2 ** (10000 * x)", TestSpec("assert", ["assert f(2) == 2 ** 20000"], [""])),
        ("def f(x):\n    return 10 ** 5000 - 1", TestSpec("assert", [f"assert f(1) == {'9' * 5000}"], [""])),
        ("print(int(input()) + 1)", TestSpec("stdin", ["9" * 5000 + "\n"], ["1" + "0" * 5000])),
        (
            "def f(x):\n    return str(10 ** 5000)",
            TestSpec("assert", ["assert int(f(1)) == 10 ** 5000\nassert isinstance(f(1), str)"], [""]),
        ),
    ]
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=2))
    assert reward([as_completion(p) for p, _ in cases], [spec.to_json() for _, spec in cases]) == [1.0] * len(cases)
    wrong = [
        "def f(x):\n    return 10 ** 5000 + 1",
        "def f(x):\n    return [x, 10 ** 5000]",
        "def f(x):\n    return 2 ** 20000 + 1",
        "def f(x):\n    return 10 ** 5000",
        "print(int(input()))",
        "def f(x):\n    return str(10 ** 5000 + 1)",
    ]
    assert reward([as_completion(p) for p in wrong], [spec.to_json() for _, spec in cases]) == [0.0] * len(cases)
