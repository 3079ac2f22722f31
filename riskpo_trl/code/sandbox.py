"""Run untrusted, model-written Python programs against test inputs, each in a fresh bubblewrap sandbox.

The boundary is the operating system (`riskpo_trl.code.bwrap`): new user/PID/network/IPC/UTS/cgroup namespaces, no
capabilities, an unprivileged uid (also on the host when the trainer runs as root), a seccomp filter, a private
``/proc`` where the runner is PID 1, a root filesystem of read-only binds of the interpreter only, and a tmpfs capped in
bytes (and, as root, in files) as the writable working directory, ``HOME``, ``TMPDIR`` and ``/dev/shm``. Where this
process can make cgroups (`riskpo_trl.code.cgroups`: root, or a delegated cgroup), each run's memory and tasks are
capped as a whole; elsewhere only per process, which the start-up log states. Inside, the runner
(`riskpo_trl.code._harness`) adds resource limits (CPU, memory, file size, open files, processes) and, as defence in
depth only, an audit hook. The deadlines are kept here, outside the sandbox (`_read_report`): the whole sandbox (its
PID namespace) is SIGKILLed when the run ends, when its wall-clock cap passes, or when a test's output is not reported
within ``test_timeout_s`` of the one before; its PID 1 is reaped here, not left to whoever reaps orphans.

Only observed outputs come back, through a pipe read up to a cap that the expected outputs set (`TestSpec.output_caps`)
and parsed by length prefixes, without regular expressions. Expected outputs never enter the sandbox, so a program
that forges the runner's report gains nothing it could not print. The code reward does not parse the report here:
`run_report` hands it, unread, to a judge process (`riskpo_trl.code.judge`).
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
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from . import cgroups, fork_safe
from .ahead import ReadyAhead
from .bwrap import INSTALL_HINT, SHM_DIR, BwrapLauncher, SandboxUnavailableError
from .faults import SandboxFault, anonymous_file, describe_os_error
from .fdwait import poll_ms, readable
from .report import HEADER_BYTES, TEST_STYLES, parse_report
from .seccomp import denied_syscalls_filter

logger = logging.getLogger(__name__)

HARNESS_SOURCE = Path(__file__).with_name("_harness.py").read_text()
ISOLATION_MODES = ("bwrap", "none")
_PYTHON_FLAGS = ["-I", "-S", "-B"]  # isolated mode, no site-packages, no bytecode files
REPORT_MARGIN = 64 * 1024  # report bytes besides the outputs: framing and the error message
KILL_WAIT_S = 10.0  # how long PID 1 may take to die after SIGKILL (the kernel ends its namespace first)
MALFORMED_REPORT = "malformed report from the sandbox"
READ_BYTES = 1 << 16  # a pipe's default capacity
EAGER_WAKEUPS = 64  # a run's report is read as records arrive up to this many wakeups (a few tests: no delay)...
READ_INTERVAL_S = 0.005  # ...then at most once per interval (a test's deadline is then at most this late)
SANDBOX_START_TIMEOUT_S = 10.0  # from the release of a held bwrap to its sandbox's PID 1 (milliseconds when idle)


class SandboxStartError(SandboxFault):
    """One run's sandbox did not start, so nothing of the program ran: the completion is unscorable, not wrong."""

    def __init__(self, message: str, cause: str = "sandbox did not start", fix: str = ""):
        super().__init__(message, cause, fix or INSTALL_HINT)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run (all its tests)."""

    test_timeout_s: float = 6.0  # wall clock per test (LiveCodeBench uses 6 s)
    total_timeout_s: float = 30.0  # wall clock for the whole run, start-up included; the hard cap per completion
    cpu_time_s: int = 30  # RLIMIT_CPU over all tests
    memory_mb: int = 2048  # the whole program with a memory cgroup (files it writes included); RLIMIT_AS per process
    max_output_bytes: int = 64 * 1024 * 1024  # RLIMIT_FSIZE (any file the program writes) and the report's size
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 16  # processes and threads of the program besides its first (pids cgroup or RLIMIT_NPROC)
    disk_mb: int = 128  # tmpfs of the working directory and /dev/shm: all files the program writes, together
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
    program_caps: str = ""  # which whole-program caps (cgroups) apply, and why any is missing
    seccomp: bool = False  # the seccomp filter exists for this architecture

    def describe(self) -> str:
        if self.mode == "none":
            return "NONE (trusted code only): rlimits, audit hook, process-group kill, scrubbed env, temp workdir"
        uid = "an unprivileged host uid per worker" if self.host_uid_dropped else "this user's uid"
        seccomp = "seccomp filter" if self.seccomp else "no seccomp filter (unknown architecture)"
        namespaces = (
            "user/pid/ipc/uts/cgroup namespaces, one network namespace with no interface for all runs (the "
            "filter refuses sockets)"
            if self.host_uid_dropped and self.seccomp
            else "user/pid/net/ipc/uts/cgroup namespaces"
        )
        return (
            f"bubblewrap ({self.bwrap}): {namespaces}, no capabilities, {uid}, "
            f"{seccomp}, read-only interpreter binds, tmpfs workdir, rlimits, audit hook, pid-namespace kill; "
            f"{self.program_caps}"
        )


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


def program_cgroups() -> cgroups.CgroupSupport:
    """The per-run cgroups this process can make (probed once per process)."""
    with _PROBE_LOCK:
        return _cached_cgroups()


@functools.cache
def _cached_cgroups() -> cgroups.CgroupSupport:
    return cgroups.detect()


def fallback_statement(support: cgroups.CgroupSupport) -> str | None:
    """What a program may hold when a controller is missing, in plain words (None when all are there)."""
    parts = []
    if not support.bounds_memory:
        parts.append(
            "memory_mb bounds each process (RLIMIT_AS), not the program: a program can hold about "
            "(max_processes + 1) x memory_mb plus its files (disk_mb); memfds and SysV shared memory, which "
            "no rlimit counts, are refused by the seccomp filter"
        )
    if not support.bounds_processes:
        parts.append("max_processes is enforced per sandbox uid by RLIMIT_NPROC only")
    if not support.bounds_cpu:
        parts.append(
            "CPU time is shared per process, not per run: a program with many busy processes can slow "
            "concurrent runs past their timeouts"
        )
    return "; ".join(parts) or None


@functools.cache
def detect_isolation() -> Isolation:
    """Check (once per process) that bubblewrap can start this interpreter in a sandbox here, and log which
    whole-program caps apply.

    Raises `SandboxUnavailableError` naming the package and kernel settings to fix when it cannot: the code reward
    never silently runs programs with weaker isolation.
    """
    bwrap = _find_bwrap()
    launcher = _launcher(bwrap)
    support = program_cgroups()
    workdir = launcher.mount_workdir(0, 1 << 20, 64)
    argv = [os.path.realpath(sys.executable), *_PYTHON_FLAGS, "-c", "pass"]
    try:
        with _BwrapStart(launcher, argv, 0, 1 << 20, workdir, None, seccomp=True, stderr=subprocess.PIPE) as start:
            output = start.process.communicate(timeout=60)[1]
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"Starting bwrap failed: {exc}. {INSTALL_HINT}") from exc
    finally:
        launcher.unmount_workdir(workdir)
    if start.process.returncode != 0:
        stderr = output.decode(errors="replace").strip()[-800:]
        raise SandboxUnavailableError(
            f"bwrap cannot start a sandbox here (exit code {start.process.returncode}: {stderr!r}). {INSTALL_HINT}"
        )
    isolation = Isolation(
        "bwrap", bwrap, host_uid_dropped=launcher.as_root, program_caps=support.describe(), seccomp=start.seccomp
    )
    fallback = fallback_statement(support)
    if fallback:
        logger.warning(
            "Code sandbox: %s. So %s. See docs/code_sandbox.md (threat model).", support.describe(), fallback
        )
    else:
        logger.info("Code sandbox: %s.", support.describe())
    return isolation


def check_shared_limits(shared: list[cgroups.SharedLimit], max_workers: int, limits: SandboxLimits) -> None:
    """Refuse to start when a memory or pids limit that the programs share with the trainer (a container's or pod's,
    `cgroups.shared_limits`) is below what the trainer uses now plus ``max_workers`` programs at their caps: then a
    program could make the kernel kill the trainer. Raises `SandboxUnavailableError` naming both figures and the
    settings that fit. (The sizing rule: docs/code_sandbox.md.)"""
    per_run = {
        "memory": limits.memory_mb << 20,
        "pids": limits.max_processes + cgroups.EXTRA_TASKS + 1,  # and one judge per worker
    }
    for found in shared:
        room = found.limit - found.usage
        need = max_workers * per_run[found.controller]
        if room >= need:
            continue
        if found.controller == "memory":
            mib = 1 << 20
            fits = [f"max_workers: {room // per_run['memory']}"] if room >= per_run["memory"] else []
            if room // max_workers >= 64 * mib:
                fits.append(f"memory_mb: {room // max_workers // mib}")
            figures = (
                f"a memory limit of {found.limit // mib} MiB, below the {_figure('memory', found.usage)} in use + "
                f"max_workers {max_workers} x memory_mb {limits.memory_mb} = {_figure('memory', found.usage + need)}"
            )
            harm = "a program could get the trainer OOM-killed"
        else:
            fits = [f"max_workers: {room // per_run['pids']}"] if room >= per_run["pids"] else []
            if room // max_workers > cgroups.EXTRA_TASKS + 1:
                fits.append(f"max_processes: {room // max_workers - cgroups.EXTRA_TASKS - 1}")
            figures = (
                f"a pids limit of {found.limit}, below the {found.usage} tasks in use + max_workers {max_workers} x "
                f"(max_processes {limits.max_processes} + "
                f"{cgroups.EXTRA_TASKS + 1}) = {found.usage + need}"
            )
            harm = "programs could leave the trainer unable to start a thread or process"
        settings = f"set code_sandbox {' or '.join(fits)}, or " if fits else ""
        raise SandboxUnavailableError(
            f"Code sandbox: the trainer's cgroup {found.path} has {figures}, shared with the programs, so {harm}; "
            f"{settings}raise the container's or pod's limit to at least "
            f"{_figure(found.controller, found.usage + need)} (sizing: docs/code_sandbox.md)."
        )


def _figure(controller: str, amount: int) -> str:
    return f"{-(-amount // (1 << 20))} MiB" if controller == "memory" else f"{amount} tasks"


def _find_bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailableError(f"bwrap (bubblewrap) is not installed or not on PATH. {INSTALL_HINT}")
    return found


def default_max_workers() -> int:
    """CPU cores per training process on this machine: every process (one per GPU) runs its own sandbox workers, so
    ``os.cpu_count()`` each would oversubscribe the CPUs ``LOCAL_WORLD_SIZE`` times (set by torchrun/accelerate)."""
    return max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


class _BwrapStart:
    """Starts bwrap held on its option pipe, moves it into the run's cgroup, then lets it go: at once, or, with
    ``hold``, when `release` is called (a context manager that closes every pipe end it made). ``report`` is the read
    end of the pipe that carries the runner's report; ``info`` that of the pipe where bwrap writes the sandbox's PID 1.
    Every pipe end is made by `fork_safe`, so none of them survives into a forked child of the trainer."""

    def __init__(
        self,
        launcher: BwrapLauncher,
        argv: list[str],
        slot: int,
        disk_bytes: int,
        workdir: str | None,
        cgroup: cgroups.RunCgroup | None,
        seccomp: bool,
        stdin=None,
        stderr=subprocess.DEVNULL,
        hold: bool = False,
    ):
        self._fds: list[int] = []
        self.process: subprocess.Popen | None = None
        try:
            self._start(launcher, argv, slot, disk_bytes, workdir, cgroup, seccomp, stdin, stderr)
            if not hold:
                self.release()
        except BaseException:
            self.__exit__()
            raise

    def _start(
        self,
        launcher: BwrapLauncher,
        argv: list[str],
        slot: int,
        disk_bytes: int,
        workdir: str | None,
        cgroup: cgroups.RunCgroup | None,
        seccomp: bool,
        stdin,
        stderr,
    ) -> None:
        args_read, args_write = self._pipe()
        self.info, info_write = self._pipe()
        self.report, report_write = self._pipe()
        seccomp_filter = denied_syscalls_filter() if seccomp else None
        self.seccomp = seccomp_filter is not None
        seccomp_read = None
        if seccomp_filter is not None:
            seccomp_read, seccomp_write = self._pipe()
            os.write(seccomp_write, seccomp_filter)  # a few hundred bytes: within any pipe's buffer
            self._close(seccomp_write)
        command, options = launcher.command(argv, slot, disk_bytes, args_read, info_write, seccomp_read, workdir)
        passed = tuple(fd for fd in (args_read, info_write, seccomp_read) if fd is not None)
        try:
            self.process = launcher.popen(
                command, slot, stdin=stdin, stdout=report_write, stderr=stderr, cwd="/", pass_fds=passed
            )
        finally:
            for fd in (*passed, report_write):
                self._close(fd)  # bwrap holds them now; EOF on ``info`` once it has written the child pid
        self._args_write, self._options = args_write, options
        try:
            if cgroup is not None:
                cgroup.add(self.process.pid)  # before bwrap reads its options, so before it forks anything
            cgroups.make_oom_victim(self.process.pid)  # and so is every process of the sandbox
        except OSError:
            self.process.kill()
            self.process.wait()
            raise

    def release(self) -> None:
        """Write bwrap's options: from here on it sets up the sandbox and runs the command."""
        try:
            with os.fdopen(self._args_write, "wb", closefd=False) as pipe:
                pipe.write(self._options)
        except OSError:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self._close(self._args_write)

    def _pipe(self) -> tuple[int, int]:
        read, write = fork_safe.pipe()
        self._fds += [read, write]
        return read, write

    def _close(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.remove(fd)
            fork_safe.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        for fd in list(self._fds):
            self._close(fd)


@dataclass
class _Prepared:
    """A sandbox ready ahead of its run: its working directory mounted, its cgroups made, bwrap started, moved into
    them and held on its option pipe, with an empty spec file as its stdin that the run fills before releasing it."""

    launcher: BwrapLauncher
    support: cgroups.CgroupSupport
    workdir: str | None
    cgroup: cgroups.RunCgroup | None
    spec_file: IO[bytes]
    start: _BwrapStart
    owner: int

    def usable(self) -> bool:
        return self.owner == os.getpid() and self.start.process.poll() is None

    def discard(self) -> None:
        """Kill bwrap if it still runs (held, it has started nothing) and free the rest; never raises."""
        if self.owner != os.getpid():
            return  # made by the process this one was forked from, which frees it
        try:
            if self.start.process.poll() is None:
                self.start.process.kill()
            self.start.process.wait(timeout=KILL_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            logger.warning("Sandbox process %d did not exit after SIGKILL.", self.start.process.pid)
        self.start.__exit__()
        fork_safe.close_file(self.spec_file)
        if self.cgroup is not None:
            self.support.release(self.cgroup)
        self.launcher.unmount_workdir(self.workdir)


def _prepare_bwrap(
    launcher: BwrapLauncher,
    support: cgroups.CgroupSupport,
    limits: SandboxLimits,
    argv: list[str],
    seccomp: bool,
    slot: int,
) -> _Prepared:
    """A sandbox for worker ``slot``, ready to run (`_Prepared`); raises `SandboxUnavailableError`."""
    workdir = launcher.mount_workdir(slot, limits.disk_mb << 20, limits.max_files)
    cgroup = spec_file = None
    try:
        if support.hierarchies:
            cgroup = support.acquire(limits.memory_mb << 20, limits.max_processes + cgroups.EXTRA_TASKS)
        with fork_safe.making():
            spec_file = anonymous_file()  # memory, not TMPDIR: a full or read-only TMPDIR cannot fail a run
            fork_safe.hold(spec_file.fileno())
        stdin = fork_safe.open_fd(f"/proc/self/fd/{spec_file.fileno()}", os.O_RDONLY)  # its own offset at 0
        try:
            start = _BwrapStart(
                launcher, argv, slot, limits.disk_mb << 20, workdir, cgroup, seccomp, stdin=stdin, hold=True
            )
        finally:
            fork_safe.close(stdin)
        return _Prepared(launcher, support, workdir, cgroup, spec_file, start, os.getpid())
    except BaseException as exc:
        if spec_file is not None:
            fork_safe.close_file(spec_file)
        if cgroup is not None:
            support.release(cgroup)
        launcher.unmount_workdir(workdir)
        if isinstance(exc, OSError):  # nothing of the program has run: the machine's fault, not the completion's
            fault = describe_os_error(exc, "preparing a sandbox (cgroup, pipe or bwrap)")
            raise SandboxStartError(str(fault), fault.cause, fault.fix) from exc
        raise


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
        seccomp: install the seccomp filter. False only to measure what it costs (benchmarks/sandbox_overhead.py).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        max_workers: int | None = None,
        isolation: str | Isolation | None = None,
        audit_guard: bool = True,
        seccomp: bool = True,
    ):
        self.limits = limits or SandboxLimits()
        self.max_workers = max_workers or default_max_workers()
        if isinstance(isolation, str):
            if isolation not in ISOLATION_MODES:
                raise ValueError(f"isolation={isolation!r} is unknown; choose one of {ISOLATION_MODES}.")
            isolation = Isolation("none") if isolation == "none" else None
        self._isolation = isolation  # probed on first use, so importing or building a Sandbox starts no process
        self.audit_guard = audit_guard
        self.seccomp = seccomp
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.max_workers):
            self._slots.put(slot)
        self._ahead: ReadyAhead[_Prepared] | None = None
        self._ahead_lock = threading.Lock()
        self._limits_checked = False  # `check_shared_limits`, once

    @property
    def isolation(self) -> Isolation:
        if self._isolation is None:
            self._isolation = detect_isolation()
        return self._isolation

    def check(self) -> Isolation:
        """Probe the isolation now (raises `SandboxUnavailableError` if bwrap does not work here); warn if none."""
        isolation = self.isolation
        if isolation.mode == "none":
            logger.warning(
                "Code sandbox runs with isolation='none': model-written programs run WITHOUT OS isolation "
                "(trusted code and tests only)."
            )
        elif not self._limits_checked:
            check_shared_limits(cgroups.shared_limits(program_cgroups()), self.max_workers, self.limits)
            self._limits_checked = True
        return isolation

    def close(self) -> None:
        """Free the sandboxes made ready ahead of their runs (one per worker slot, kept between batches). Also done
        when this object is garbage-collected and at exit. Runs after it still work, and make sandboxes ready again."""
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()

    def run(
        self,
        source: str,
        inputs: list[str],
        style: str = "stdin",
        fn_name: str | None = None,
        output_caps: list[int] | None = None,
    ) -> ExecutionResult:
        """Run ``source`` once per test input and return the observed outputs.

        ``style`` is "stdin" (input is stdin text), "functional" (input is newline-separated JSON arguments of
        ``fn_name``, a function or ``Solution`` method; output is the JSON of its return value) or "assert" (input is
        test code run after the program, instrumented by `TestSpec.sandbox_inputs`; output is the JSON list of the
        values its assertions recorded, when it completes). ``output_caps`` (bytes per test, `TestSpec.output_caps`)
        bounds what is read back: a report beyond their sum, or an output beyond its cap, is an error and is not
        parsed. Without caps the whole report is bounded by ``limits.max_output_bytes``. The report is parsed in this
        process; the code reward instead hands it unparsed to a judge process (`run_report`).
        """
        start = time.monotonic()
        data, error = self.run_report(source, inputs, style, fn_name, output_caps)
        if error is None:
            outputs, error = parse_report(data, len(inputs), output_caps)
        else:
            outputs = []
        return ExecutionResult(outputs, error, time.monotonic() - start)

    def run_report(
        self,
        source: str,
        inputs: list[str],
        style: str = "stdin",
        fn_name: str | None = None,
        output_caps: list[int] | None = None,
    ) -> tuple[bytes, str | None]:
        """Like `run`, but the runner's report unparsed: (report bytes, error or None). What the code reward hands to
        its judge process (`riskpo_trl.code.judge`), so that the trainer never decodes a program's output."""
        if style not in TEST_STYLES:
            raise ValueError(f"style={style!r} is unknown; choose one of {TEST_STYLES}.")
        if style == "functional" and not fn_name:
            raise ValueError("style='functional' needs fn_name, the function or Solution method to call.")
        if output_caps is not None and len(output_caps) != len(inputs):
            raise ValueError(f"output_caps has {len(output_caps)} entries for {len(inputs)} inputs; give one each.")
        isolation = self.isolation
        slot = self._slots.get()
        try:
            return self._run(source, inputs, style, fn_name, slot, isolation, output_caps)
        finally:
            self._slots.put(slot)

    def report_limit(self, n_tests: int, output_caps: list[int] | None) -> int:
        """The most report bytes read back from one run."""
        limit = self.limits.max_output_bytes + REPORT_MARGIN
        if output_caps is not None:
            limit = min(limit, sum(output_caps) + 32 * n_tests + REPORT_MARGIN)
        return limit

    def _run(
        self,
        source: str,
        inputs: list[str],
        style: str,
        fn_name: str | None,
        slot: int,
        isolation: Isolation,
        output_caps: list[int] | None,
    ) -> tuple[bytes, str | None]:
        support = program_cgroups() if isolation.mode == "bwrap" else cgroups.CgroupSupport()
        spec = {
            "source": source,
            "inputs": inputs,
            "style": style,
            "fn_name": fn_name,
            "audit_guard": self.audit_guard,
            "nproc_rlimit": not support.bounds_processes,
            "shared_memory_dir": SHM_DIR if isolation.mode == "bwrap" else None,
            **asdict(self.limits),
        }
        # The spec (program and inputs, never expected outputs) arrives on stdin from an unnamed read-only file.
        encoded = json.dumps(spec).encode()
        if isolation.mode == "bwrap":
            return self._run_bwrap(encoded, slot, isolation, support, len(inputs), output_caps)
        try:
            with anonymous_file() as spec_file:
                spec_file.write(encoded)
                spec_file.flush()
                stdin = open(f"/proc/self/fd/{spec_file.fileno()}", "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            fault = describe_os_error(exc, "writing a run's spec file")
            raise SandboxStartError(str(fault), fault.cause, fault.fix) from exc
        with stdin:
            return self._run_unisolated(stdin, len(inputs), output_caps)

    def _argv(self, isolation: Isolation) -> list[str]:
        executable = sys.executable if isolation.mode == "none" else os.path.realpath(sys.executable)
        return [executable, *_PYTHON_FLAGS, "-c", HARNESS_SOURCE]

    def _ready_ahead(self, isolation: Isolation, support: cgroups.CgroupSupport) -> ReadyAhead[_Prepared]:
        """The sandboxes made ready ahead of their runs, one per slot (made on first use; freed with this object)."""
        with self._ahead_lock:
            if self._ahead is None:
                prepare = functools.partial(
                    _prepare_bwrap,
                    _launcher(isolation.bwrap),
                    support,
                    self.limits,
                    self._argv(isolation),
                    self.seccomp,
                )
                self._ahead = ReadyAhead(prepare, _Prepared.discard, _Prepared.usable, self.max_workers)
                weakref.finalize(self, self._ahead.close)
            return self._ahead

    def _run_bwrap(
        self,
        spec: bytes,
        slot: int,
        isolation: Isolation,
        support: cgroups.CgroupSupport,
        n_tests: int,
        output_caps: list[int] | None,
    ) -> tuple[bytes, str | None]:
        ahead = self._ready_ahead(isolation, support)
        prepared = ahead.take(slot)
        ahead.refill(slot)  # the slot's next sandbox gets ready while this one runs
        try:
            try:
                prepared.spec_file.write(spec)
                prepared.spec_file.flush()
            except OSError as exc:
                fault = describe_os_error(exc, "writing a run's spec file")
                raise SandboxStartError(str(fault), fault.cause, fault.fix) from exc
            deadline = time.monotonic() + self.limits.total_timeout_s
            try:
                prepared.start.release()
            except OSError as exc:  # nothing of the program has run yet: the machine's fault, not the completion's
                raise SandboxStartError(
                    f"could not start a sandbox (bwrap's option pipe): {exc}", "bwrap's option pipe broke"
                ) from exc
            init_pidfd = None
            try:
                init_pidfd = _namespace_init(prepared.start.info, prepared.start.process, deadline)
                return self._collect(prepared.start.process, prepared.start.report, n_tests, output_caps, deadline)
            finally:
                _kill_bwrap(prepared.start.process, init_pidfd)
        finally:
            prepared.discard()

    def _run_unisolated(self, stdin, n_tests: int, output_caps: list[int] | None) -> tuple[bytes, str | None]:
        try:
            workdir = tempfile.mkdtemp(prefix="riskpo-sandbox-")
        except OSError as exc:
            fault = describe_os_error(exc, "making the run's working directory")
            raise SandboxStartError(str(fault), fault.cause, fault.fix) from exc
        environment = {
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PATH": "/usr/bin:/bin",
        }
        deadline = time.monotonic() + self.limits.total_timeout_s
        try:
            process = subprocess.Popen(
                self._argv(Isolation("none")),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=workdir,
                env=environment,
                start_new_session=True,
            )
            try:
                return self._collect(process, process.stdout.fileno(), n_tests, output_caps, deadline)
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                process.wait()
                process.stdout.close()
        finally:
            remove_tree(workdir)

    def _collect(
        self, process: subprocess.Popen, report: int, n_tests: int, output_caps: list[int] | None, deadline: float
    ) -> tuple[bytes, str | None]:
        """The runner's report from descriptor ``report``, read up to its cap until the deadlines (`_read_report`);
        then a short wait for a clean exit."""
        data, error = _read_report(
            report, self.report_limit(n_tests, output_caps), deadline, n_tests, self.limits.test_timeout_s
        )
        if error is None:
            try:
                process.wait(timeout=max(0.1, min(deadline - time.monotonic(), self.limits.total_timeout_s / 10)))
            except subprocess.TimeoutExpired:
                pass
            if process.returncode not in (0, None):
                error = f"sandbox exited with {_describe_status(process.returncode)}"
        return data, error


class _TestClock:
    """Follows the runner's records as they arrive, by their framing only (a kind byte and a length; no payload is
    decoded), and says when the clock of the next test restarts: at the start mark, then at each test's output."""

    def __init__(self, n_tests: int):
        self.n_tests, self.position, self.started, self.outputs, self.ended = n_tests, 0, False, 0, False

    def advance(self, data: bytearray) -> tuple[bool, str | None]:
        """(whether a test's clock restarted, error) after ``data`` grew."""
        restarted = False
        while not self.ended:
            newline = data.find(b"\n", self.position, self.position + HEADER_BYTES)
            if newline < 0:
                return restarted, (MALFORMED_REPORT if len(data) - self.position >= HEADER_BYTES else None)
            kind, digits = data[self.position : self.position + 1], data[self.position + 1 : newline]
            if not digits.isdigit():
                return restarted, MALFORMED_REPORT
            end = newline + 1 + int(digits)
            if end > len(data):
                return restarted, None
            self.position = end
            if kind == b"S" and not self.started:
                self.started = restarted = True
            elif kind == b"O" and self.started and self.outputs < self.n_tests:
                self.outputs += 1
                restarted = True
            elif kind in (b"E", b"D"):
                self.ended = True  # EOF is due at once: the current test's clock keeps running
            else:
                return restarted, MALFORMED_REPORT  # a second start mark, or outputs before it or beyond the tests
        return restarted, None


def _read_report(
    fd: int, limit: int, deadline: float, n_tests: int, test_timeout_s: float
) -> tuple[bytes, str | None]:
    """Everything the sandbox writes before EOF, or an error when over ``limit`` bytes (then nothing more is read:
    the trainer holds at most ``limit`` bytes of a report), on a malformed record, or on timeout: past ``deadline``,
    or when a test's record is not complete within ``test_timeout_s`` of the record before it (`_TestClock`), EOF
    included: an end or error record stops no clock, so a run takes at most (tests + 1) x ``test_timeout_s`` after
    its start mark whatever the program writes. This clock is the trainer's, outside the sandbox: the caller then
    kills the sandbox, so nothing the program does extends it. Waits with poll, which has no limit on descriptor
    numbers; past `EAGER_WAKEUPS` wakeups of a run, records are read in blocks of `READ_INTERVAL_S`, so the trainer's
    CPU per run stays bounded however many tests it has."""
    data, clock, test_deadline, wakeups = bytearray(), _TestClock(n_tests), None, 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        due = deadline if test_deadline is None else min(deadline, test_deadline)
        if not poller.poll(poll_ms(due - time.monotonic())):
            if time.monotonic() < due:
                continue
            if due == deadline:
                return b"", "timeout: the run exceeded its total time limit"
            return b"", f"timeout: test {clock.outputs} ran past test_timeout_s={test_timeout_s:g}"
        chunk = os.read(fd, min(READ_BYTES, limit + 1 - len(data)))
        if not chunk:
            return bytes(data), None
        data += chunk
        if len(data) > limit:
            return b"", f"report over {limit} bytes (the cap the expected outputs set)"
        restarted, error = clock.advance(data)
        if error is not None:
            return b"", error
        if restarted:
            test_deadline = time.monotonic() + test_timeout_s
        wakeups += 1
        if wakeups > EAGER_WAKEUPS and len(chunk) < READ_BYTES:  # records trickle in: let them gather
            time.sleep(max(0.0, min(READ_INTERVAL_S, due - time.monotonic())))


def _namespace_init(info: int, process: subprocess.Popen, deadline: float) -> int | None:
    """A pidfd of the sandbox's PID 1, from the ``{"child-pid": N}`` bwrap writes to ``info`` right after starting it;
    None when PID 1 has already gone. Raises `SandboxStartError` when bwrap did not start it within
    `SANDBOX_START_TIMEOUT_S` (nothing of the program ran).

    The pidfd is taken only while N is still bwrap's child (checked after opening), so a reused pid is never killed.
    """
    data, started = b"", time.monotonic()
    start_deadline = min(deadline, started + SANDBOX_START_TIMEOUT_S)
    while time.monotonic() < start_deadline and len(data) < 4096:
        chunk = os.read(info, 4096) if readable(info, start_deadline - time.monotonic()) else b""
        if not chunk:
            break
        data += chunk
    try:
        child = int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        waited = time.monotonic() - started
        raise SandboxStartError(
            f"bwrap did not start the sandbox ({waited:.1f} s, exit status {process.poll()})"
        ) from exc
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        return None  # PID 1 already exited: its namespace is gone
    try:
        with open(f"/proc/{child}/status") as status:
            parent = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        parent = None
    if parent != process.pid:
        os.close(pidfd)
        return None
    return pidfd


def _kill_bwrap(process: subprocess.Popen, init_pidfd: int | None) -> None:
    """SIGKILL the sandbox, also after a normal exit, and reap it.

    The sandbox's PID 1 is killed directly (it also dies with bwrap through ``--die-with-parent``); the kernel then
    kills every process left in its PID namespace, whatever session or parent-death signal they set. bwrap, PID 1's
    parent, reaps it and exits: it is waited for, not killed first, or PID 1 would be left a zombie for whoever reaps
    orphans (nobody, when the trainer is a container's PID 1 without an init).
    """
    if init_pidfd is not None:
        try:
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
            # PID 1 exits only once the kernel has ended every other process of the namespace: wait for that
            if not readable(init_pidfd, KILL_WAIT_S):
                logger.warning("The sandbox's PID 1 did not exit within %.0f s of SIGKILL.", KILL_WAIT_S)
            process.wait(timeout=KILL_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            os.close(init_pidfd)
    if process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        logger.warning("Sandbox process %d did not exit after SIGKILL.", process.pid)


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


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
