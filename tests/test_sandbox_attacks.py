"""Hostile programs through the public `CodeReward`: none may forge a pass, escape, survive, or crash the trainer.

Every attack runs twice: with the runner's audit hook (the default) and without it (``audit_guard=False``), so the
bubblewrap layer is shown to hold on its own. Each program prints the expected answer only if its attack worked, so a
reward of 1.0 means a hole; the host-side checks (markers, connections, stray processes, hostname, xattrs, the
stand-in trainer) do not depend on the program telling the truth. Every attack is bounded: small loops, short sleeps,
markers in pytest's temporary directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from helpers import processes_with
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec

LIMITS = SandboxLimits(test_timeout_s=2.0, total_timeout_s=4.0, cpu_time_s=3, memory_mb=512,
                       max_output_bytes=1 << 20, disk_mb=16, max_processes=8, max_files=2000)
SECRET_VAR = "RISKPO_FAKE_API_TOKEN"

# The attack on the runner itself: its deny tables are globals of __main__, so one line empties them. Every escape
# program starts with it, so that with the audit hook on, what stops the rest is the OS layer.
DISARM = """
import sys
_runner = sys.modules["__main__"]
_runner._DENIED_EVENTS = frozenset()
_runner._PATH_ARGS = {}
_runner._DIR_FD_ARGS = {}
"""


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{program}\n```"}]


@pytest.fixture(scope="module")
def secret() -> str:
    return f"riskpo-secret-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def trainer_stand_in(secret):
    """A process standing in for the trainer: the secret in its environment, command line and memory."""
    process = subprocess.Popen([sys.executable, "-c", f"import time\nkept = {secret!r} * 4\ntime.sleep(300)"],
                               env={**os.environ, SECRET_VAR: secret})
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
            except (socket.timeout, OSError):
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
        "/proc/<trainer>/mem": DISARM + textwrap.dedent(f"""
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
    survivor = (f"import time\nfor _ in range(40):\n    time.sleep(0.25)\n"
                f"{write_marker.format(path=marker('survivor'))}\n")
    return {
        "deny-table rewrite then subprocess": DISARM + textwrap.dedent(f"""
            import os, subprocess
            subprocess.run([sys.executable, "-c", {write_marker.format(path=marker('subprocess'))!r}], timeout=2)
            subprocess.run(["/bin/sh", "-c", "echo escaped > {marker('shell')}"], timeout=2)
            if os.path.exists({marker('subprocess')!r}) or os.path.exists({marker('shell')!r}):
                print(3)
            """),
        "_posixsubprocess.fork_exec": textwrap.dedent(f"""
            import _posixsubprocess, os, sys
            errpipe_read, errpipe_write = os.pipe()
            code = {write_marker.format(path=marker('fork_exec'))!r}
            exe = os.fsencode(sys.executable)
            pid = _posixsubprocess.fork_exec(
                [exe, b"-c", code.encode()], [exe], True, (errpipe_write,), None, None,
                -1, -1, -1, -1, -1, -1, errpipe_read, errpipe_write, True, False, -1, None, None, None, -1, None,
                False)
            os.close(errpipe_write)
            os.waitpid(pid, 0)
            if os.path.exists({marker('fork_exec')!r}):
                print(3)
            """),
        "write outside": textwrap.dedent(f"""
            import os, sys
            for path in ({marker('direct')!r}, "/marker", "/usr/marker", "/dev/marker", "/dev/shm/marker",
                         os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "marker")):
                try:
                    open(path, "w").write("escaped")
                    print(3)
                    break
                except OSError:
                    pass
            """),
        "dir_fd opens": DISARM + textwrap.dedent(f"""
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
        "ctypes syscalls and memory writes": DISARM + textwrap.dedent(f"""
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
        "setxattr on the interpreter": textwrap.dedent(f"""
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
        "nsenter into the trainer's network namespace": DISARM + textwrap.dedent(f"""
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
        "loopback network": DISARM + textwrap.dedent(f"""
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
        "kill the trainer": DISARM + textwrap.dedent(f"""
            import os, signal
            for pid in ({trainer_pid}, {stand_in_pid}):
                try:
                    os.kill(pid, signal.SIGKILL)
                    print(3)
                except OSError:
                    pass
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal: inside the PID namespace, only itself
            """),
        "setsid survivor without parent-death signal": DISARM + textwrap.dedent(f"""
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
        "setsid survivor of a timed-out run": DISARM + textwrap.dedent(f"""
            import ctypes, os, sys
            if os.fork() == 0:
                os.setsid()
                ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
                os.execv(sys.executable, [sys.executable, "-c", {survivor!r}, {token!r}])
            while True:
                pass
            """),
        "fork flood": DISARM + textwrap.dedent("""
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
        "1 GiB write": textwrap.dedent("""
            import os
            chunk, written = b"x" * (1 << 20), 0
            for index in range(1024):
                try:
                    with open(f"blob{index}", "wb") as f:
                        f.write(chunk)
                    written += len(chunk)
                except OSError:
                    break
            if written >= 256 << 20:
                print(3)
            """),
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


def _output_attack_specs() -> list[tuple[str, str, str]]:
    """(name, program, TestSpec JSON) of programs whose output or report is built to crash the grader."""
    forge = textwrap.dedent("""
        import os
        line = {payload}
        for fd in range(1, 32):
            try:
                os.write(fd, line)
            except OSError:
                pass
        os._exit(0)
        """)
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
        ("3000-deep list", "def f(x):\n    v = []\n    for _ in range(3000):\n        v = [v]\n    return v",
         functional),
        ("forged deep report", forge.format(
            payload='b\'{"outputs": ["\' + b"[" * 3000 + b"1" + b"]" * 3000 + b\'"], "error": null}\\n\''),
         functional),
        ("forged deep assert records", forge.format(
            payload='b\'{"outputs": ["\' + b"[" * 3000 + b\'"], "error": null}\\n\''), assert_style),
        ("[ x 100,000 as the report", forge.format(payload='b"[" * 100_000 + b"\\n"'), stdin),
        ("junk bytes as the report", forge.format(payload='bytes(range(256)) * 64 + b"\\n"'), stdin),
        ("forged huge-int report", forge.format(
            payload='b\'{"outputs": ["\' + b"9" * 5000 + b\'"], "error": null}\\n\''), integer),
        ("huge stdout", "import sys\nwhile True:\n    sys.stdout.write('x' * (1 << 16))", stdin),
    ]


def test_hostile_outputs_score_zero_and_never_raise():
    specs = _output_attack_specs()
    reward = CodeReward(sandbox=Sandbox(LIMITS, max_workers=4))
    scores = reward([as_completion(program) for _, program, _ in specs], [spec for _, _, spec in specs])
    assert dict(zip([name for name, _, _ in specs], scores)) == {name: 0.0 for name, _, _ in specs}
