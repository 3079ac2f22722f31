"""Run untrusted, model-written Python programs against test inputs, each in a fresh bubblewrap sandbox.

The boundary is the operating system (`riskpo_trl.code.bwrap`): new user/PID/network/IPC/UTS/cgroup namespaces, no
capabilities, an unprivileged uid (also on the host when the trainer runs as root), a private ``/proc``, a root
filesystem of read-only binds of the interpreter only, and a tmpfs capped in bytes (and, as root, in files) as the
writable working directory, ``HOME`` and ``TMPDIR``. Inside it the runner (`riskpo_trl.code._harness`) adds resource limits (CPU, memory, file
size, open files, processes), a per-test timer and, as defence in depth only, an audit hook. The whole sandbox (its
PID namespace) is SIGKILLed when the run ends or its wall-clock cap passes.

Only observed outputs come back, through a pipe read with a size cap; expected outputs never leave this process (see
`riskpo_trl.code.testspec`), so a program that forges the runner's report gains nothing it could not print.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import bounded_json
from .bwrap import INSTALL_HINT, BwrapLauncher, SandboxUnavailableError

logger = logging.getLogger(__name__)

HARNESS_SOURCE = Path(__file__).with_name("_harness.py").read_text()
TEST_STYLES = ("stdin", "functional", "assert")
ISOLATION_MODES = ("bwrap", "none")
_PYTHON_FLAGS = ["-I", "-S", "-B"]  # isolated mode, no site-packages, no bytecode files


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run (all its tests)."""

    test_timeout_s: float = 6.0  # wall clock per test (LiveCodeBench uses 6 s)
    total_timeout_s: float = 30.0  # wall clock for the whole run, start-up included; the hard cap per completion
    cpu_time_s: int = 30  # RLIMIT_CPU over all tests
    memory_mb: int = 2048  # RLIMIT_AS: address space, so it also bounds threads' stacks
    max_output_bytes: int = 64 * 1024 * 1024  # RLIMIT_FSIZE: any file the program writes, its stdout included
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 16  # RLIMIT_NPROC headroom (threads count) inside the sandbox
    disk_mb: int = 128  # size of the tmpfs working directory: all files the program writes, together
    max_files: int = 10_000  # files and directories in it (enforced when the trainer runs as root; see the docs)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"SandboxLimits.{name}={value} must be > 0.")


@dataclass(frozen=True)
class Isolation:
    """The isolation a `Sandbox` runs programs under; `detect_isolation` probes the bubblewrap one."""

    mode: str  # "bwrap" or "none"
    bwrap: str | None = None  # path of the bwrap binary
    host_uid_dropped: bool = False  # running as root: sandboxes run as an unprivileged host uid per worker slot

    def describe(self) -> str:
        if self.mode == "none":
            return "NONE (trusted code only): rlimits, audit hook, process-group kill, scrubbed env, temp workdir"
        uid = "an unprivileged host uid per worker" if self.host_uid_dropped else "this user's uid"
        return (f"bubblewrap ({self.bwrap}): user/pid/net/ipc/uts/cgroup namespaces, no capabilities, {uid}, "
                "read-only interpreter binds, tmpfs workdir, rlimits, audit hook, pid-namespace kill")


@dataclass(frozen=True)
class ExecutionResult:
    """What a run observed: one output per passed-through test (stops at the first failure), or an error."""

    outputs: list[str]
    error: str | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


_PROBE_LOCK = threading.Lock()  # one launcher (and one staging namespace) per process, also when threads race


def _launcher(bwrap: str) -> BwrapLauncher:
    with _PROBE_LOCK:
        return _cached_launcher(bwrap)


@functools.cache
def _cached_launcher(bwrap: str) -> BwrapLauncher:
    return BwrapLauncher(bwrap)


@functools.cache
def detect_isolation() -> Isolation:
    """Check (once per process) that bubblewrap can start this interpreter in a sandbox here.

    Raises `SandboxUnavailableError` naming the package and kernel settings to fix when it cannot: the code reward
    never silently runs programs with weaker isolation.
    """
    bwrap = _find_bwrap()
    launcher = _launcher(bwrap)
    workdir = launcher.mount_workdir(0, 1 << 20, 64)
    argv = [os.path.realpath(sys.executable), *_PYTHON_FLAGS, "-c", "pass"]
    command, options = launcher.command(argv, 0, 1 << 20, workdir=workdir)
    try:
        probe = subprocess.run(command, capture_output=True, timeout=60, cwd="/", **options)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"Starting bwrap failed: {exc}. {INSTALL_HINT}") from exc
    finally:
        launcher.unmount_workdir(workdir)
    if probe.returncode != 0:
        stderr = probe.stderr.decode(errors="replace").strip()[-800:]
        raise SandboxUnavailableError(
            f"bwrap cannot start a sandbox here (exit code {probe.returncode}: {stderr!r}). {INSTALL_HINT}")
    return Isolation("bwrap", bwrap, host_uid_dropped=launcher.as_root)


def _find_bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailableError(f"bwrap (bubblewrap) is not installed or not on PATH. {INSTALL_HINT}")
    return found


def default_max_workers() -> int:
    """CPU cores per training process on this machine: every process (one per GPU) runs its own sandbox workers, so
    ``os.cpu_count()`` each would oversubscribe the CPUs ``LOCAL_WORLD_SIZE`` times (set by torchrun/accelerate)."""
    return max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


class Sandbox:
    """Runs programs against test inputs, up to ``max_workers`` at a time (thread-safe).

    Args:
        limits: resource limits of each run.
        max_workers: concurrent runs. Default `default_max_workers()`: this machine's cores shared among the training
            processes on it.
        isolation: "bwrap" (default: bubblewrap, probed on first use; raises `SandboxUnavailableError` if it does
            not work here) or "none": no OS isolation, for trusted code in tests only (`check` warns, and
            `CodeReward` calls it on every batch).
        audit_guard: install the runner's audit hook (defence in depth). False only to test that the OS layer holds
            on its own.
    """

    def __init__(self, limits: SandboxLimits | None = None, max_workers: int | None = None,
                 isolation: str | Isolation | None = None, audit_guard: bool = True):
        self.limits = limits or SandboxLimits()
        self.max_workers = max_workers or default_max_workers()
        if isinstance(isolation, str):
            if isolation not in ISOLATION_MODES:
                raise ValueError(f"isolation={isolation!r} is unknown; choose one of {ISOLATION_MODES}.")
            isolation = Isolation("none") if isolation == "none" else None
        self._isolation = isolation  # probed on first use, so importing or building a Sandbox starts no process
        self.audit_guard = audit_guard
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.max_workers):
            self._slots.put(slot)

    @property
    def isolation(self) -> Isolation:
        if self._isolation is None:
            self._isolation = detect_isolation()
        return self._isolation

    def check(self) -> Isolation:
        """Probe the isolation now (raises `SandboxUnavailableError` if bwrap does not work here); warn if none."""
        isolation = self.isolation
        if isolation.mode == "none":
            logger.warning("Code sandbox runs with isolation='none': model-written programs run WITHOUT OS isolation "
                           "(trusted code and tests only).")
        return isolation

    def run(self, source: str, inputs: list[str], style: str = "stdin", fn_name: str | None = None) -> ExecutionResult:
        """Run ``source`` once per test input and return the observed outputs.

        ``style`` is "stdin" (input is stdin text), "functional" (input is newline-separated JSON arguments of
        ``fn_name``, a function or ``Solution`` method; output is the JSON of its return value) or "assert" (input is
        test code run after the program, instrumented by `TestSpec.sandbox_inputs`; output is the JSON list of the
        values its assertions recorded, when it completes).
        """
        if style not in TEST_STYLES:
            raise ValueError(f"style={style!r} is unknown; choose one of {TEST_STYLES}.")
        if style == "functional" and not fn_name:
            raise ValueError("style='functional' needs fn_name, the function or Solution method to call.")
        isolation = self.isolation
        slot = self._slots.get()
        try:
            return self._run(source, inputs, style, fn_name, slot, isolation)
        finally:
            self._slots.put(slot)

    def _run(self, source: str, inputs: list[str], style: str, fn_name: str | None, slot: int,
             isolation: Isolation) -> ExecutionResult:
        start = time.monotonic()
        spec = {"source": source, "inputs": inputs, "style": style, "fn_name": fn_name,
                "audit_guard": self.audit_guard, **asdict(self.limits)}
        argv = [sys.executable if isolation.mode == "none" else os.path.realpath(sys.executable), *_PYTHON_FLAGS,
                "-c", HARNESS_SOURCE]
        workdir, info, launcher, capped_dir = None, None, None, None
        if isolation.mode == "bwrap":
            launcher = _launcher(isolation.bwrap)
            capped_dir = launcher.mount_workdir(slot, self.limits.disk_mb << 20, self.limits.max_files)
            info, info_write = os.pipe()
            command, options = launcher.command(argv, slot, self.limits.disk_mb << 20, info_write, capped_dir)
            options.update(cwd="/", pass_fds=(info_write,))
        else:
            workdir = tempfile.mkdtemp(prefix="riskpo-sandbox-")
            command, options = argv, {"cwd": workdir, "start_new_session": True,
                                      "env": {"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
                                              "PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin"}}
        try:
            # The spec (program and inputs, never expected outputs) arrives on stdin from an unnamed read-only file.
            with tempfile.TemporaryFile() as spec_file:
                spec_file.write(json.dumps(spec).encode())
                spec_file.flush()
                with open(f"/proc/self/fd/{spec_file.fileno()}", "rb") as stdin:
                    report, error = self._execute(command, options, stdin, len(inputs), info)
            if report is None:
                return ExecutionResult([], error or "no report from the sandbox", time.monotonic() - start)
            return ExecutionResult(report["outputs"], error or report["error"], time.monotonic() - start)
        finally:
            for fd in (info, *options.get("pass_fds", ())):
                if fd is not None:
                    os.close(fd)
            if workdir is not None:
                remove_tree(workdir)
            if launcher is not None:
                launcher.unmount_workdir(capped_dir)

    def _execute(self, command: list[str], options: dict, stdin, n_tests: int,
                 info: int | None) -> tuple[dict | None, str | None]:
        """Start the sandbox, read its report up to the cap until the total timeout, then SIGKILL it: its PID 1 (the
        kernel then kills every process of its PID namespace) and bwrap."""
        limit = 2 * self.limits.max_output_bytes + (1 << 20)
        deadline = time.monotonic() + self.limits.total_timeout_s
        process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **options)
        for fd in options.pop("pass_fds", ()):
            os.close(fd)  # bwrap holds the write end now; EOF on ``info`` once it has written the child pid
        error, init_pidfd = None, None
        try:
            if info is not None:
                init_pidfd = _namespace_init(info, process, deadline)
            data, error = _read_capped(process.stdout, limit, deadline)
            if error is None:
                try:
                    process.wait(timeout=max(0.1, self.limits.total_timeout_s / 10))
                except subprocess.TimeoutExpired:
                    pass
                if process.returncode not in (0, None):
                    error = f"sandbox exited with {_describe_status(process.returncode)}"
        finally:
            _kill(process, init_pidfd, new_session=options.get("start_new_session", False))
        if error is not None:
            return None, error
        return _parse_report(data, limit, n_tests), None


def _read_capped(stream, limit: int, deadline: float) -> tuple[bytes, str | None]:
    """Everything the sandbox writes before EOF, or an error on timeout or when over ``limit`` bytes."""
    chunks, size = [], 0
    fd = stream.fileno()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"", "timeout: the run exceeded its total time limit"
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), None
        size += len(chunk)
        if size > limit:
            return b"", f"report over {limit} bytes"
        chunks.append(chunk)


def _namespace_init(info: int, process: subprocess.Popen, deadline: float) -> int | None:
    """A pidfd of the sandbox's PID 1, from the ``{"child-pid": N}`` bwrap writes to ``info`` right after starting it.

    The pidfd is taken only while N is still bwrap's child (checked after opening), so a reused pid is never killed.
    """
    data = b""
    while time.monotonic() < deadline and len(data) < 4096:
        ready, _, _ = select.select([info], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(info, 4096) if ready else b""
        if not chunk:
            break
        data += chunk
    try:
        child = int(json.loads(data)["child-pid"])
        pidfd = os.pidfd_open(child)
    except (ValueError, KeyError, TypeError, OSError):
        return None  # bwrap failed before starting the sandbox; killing bwrap is all there is to do
    try:
        with open(f"/proc/{child}/status") as status:
            parent = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        parent = None
    if parent != process.pid:
        os.close(pidfd)
        return None
    return pidfd


def _kill(process: subprocess.Popen, init_pidfd: int | None, new_session: bool) -> None:
    """SIGKILL the sandbox, also after a normal exit. Under bwrap, its PID 1 is killed directly (and also dies with
    bwrap through ``--die-with-parent``); the kernel then kills every process left in the sandbox's PID namespace,
    whatever session or parent-death signal they set."""
    if init_pidfd is not None:
        try:
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
            # PID 1 exits only once the kernel has ended every other process of the namespace: wait for that
            if not select.select([init_pidfd], [], [], 10)[0]:
                logger.warning("The sandbox's PID 1 did not exit within 10 s of SIGKILL.")
        except OSError:
            pass
        finally:
            os.close(init_pidfd)
    try:
        if new_session:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.warning("Sandbox process %d did not exit after SIGKILL.", process.pid)
    if process.stdout is not None:
        process.stdout.close()


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _parse_report(data: bytes, limit: int, n_tests: int) -> dict | None:
    """The runner's last report line if it is well-formed (outputs: list of str, error: str or None)."""
    lines = data.decode("utf-8", errors="replace").strip().splitlines()
    if not lines:
        return None
    try:  # a real report is {"outputs": [one string per test], "error": string or null}: little outside strings
        report = bounded_json.loads(lines[-1], max_bytes=limit, max_depth=2, max_structure=64 + 4 * n_tests)
    except ValueError:
        return None
    if not isinstance(report, dict) or not isinstance(report.get("outputs"), list):
        return None
    if not all(isinstance(output, str) for output in report["outputs"]):
        return None
    if not (report.get("error") is None or isinstance(report["error"], str)):
        return None
    return report


def remove_tree(path: str) -> None:
    """Delete a directory tree of any depth, without recursion and without following symlinks; never raises (a
    failure is logged and the rest is left in place)."""
    stack: list[int] = []  # open fds of the directories from ``path`` down to the one being emptied
    names: list[str] = []  # names[i] is the name of stack[i + 1] inside stack[i]
    try:
        stack.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        while stack:
            fd, subdirectory = stack[-1], None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirectory = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if subdirectory is not None:
                os.chmod(subdirectory, 0o700, dir_fd=fd)  # a program may have left it unreadable
                stack.append(os.open(subdirectory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd))
                names.append(subdirectory)
                continue
            os.close(stack.pop())
            if names:
                os.rmdir(names.pop(), dir_fd=stack[-1])
        os.rmdir(path)
    except Exception as exc:  # noqa: BLE001 - cleanup must never take the trainer down
        logger.warning("Could not fully clean up the sandbox directory %s: %s", path, exc)
        for fd in stack:
            try:
                os.close(fd)
            except OSError:
                pass
