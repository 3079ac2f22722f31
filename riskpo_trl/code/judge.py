"""The judge: separate, bounded processes that decide whether a run's report passes its tests.

Everything that touches a value a program produced (parsing its report, decoding JSON into Python values, hashing,
comparing, evaluating assert-style probes over it) happens in a judge process, never in the trainer's interpreter:
a program can make those steps cost seconds of CPU held under the GIL (colliding hashes) or gigabytes (``%``
formatting, sequence repetition), which in the trainer would stall or starve every concurrent completion.

One judge per judgement. The trainer starts a judge server once (``python -I -S -B`` loading only this package's
stdlib-only judging modules, `riskpo_trl.code._judge_main`), and the server forks a fresh judge for each request, so
a judge starts in about a millisecond instead of an interpreter's start-up. Each judge sets its own RLIMIT_CPU and
RLIMIT_AS before it reads anything, and is SIGKILLed by the server when its wall-clock time is up. It reads the test
spec (expected values included) and the report from an unnamed memory file (no ``TMPDIR`` space needed), and writes
a verdict of at most `MAX_VERDICT_BYTES` to a pipe made by `fork_safe` (a fork of the trainer from another thread never
holds its write end); the trainer takes the first whole message and stops waiting shortly after the judge's deadline
whatever happens. No program runs in a judge: it only ever receives the bytes the sandbox reported. A judge that
overruns its CPU or memory limits fails that one completion (the report made it do so); a judge that could not start,
or was killed at its wall-clock deadline having had less than a tenth of that time on a CPU (a starved machine), or a
verdict that never arrives, is the machine's fault: `SandboxFault`, so the completion is unscorable, not wrong.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import fork_safe
from .faults import SandboxFault, anonymous_file, describe_os_error
from .fdwait import readable

MAX_VERDICT_BYTES = 512
PASS, FAIL, UNSCORABLE = b"P", b"F", b"U"  # U: the judge could not judge (a fault of the machine, not the program)
LENGTH_BYTES = 2  # each message on the verdict pipe: its length (big-endian), then its bytes
DEADLINE_MARGIN_S = 1.0  # how long after a judge's deadline the trainer still waits for its verdict
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding riskpo_trl/
# The judge server's interpreter: the package root first on its path (``-I`` leaves out the current directory and
# PYTHONPATH, ``-S`` site-packages); the package's ``__init__`` files import nothing until asked, so only the judging
# modules load.
_BOOT = """
import sys
try:  # the judges (forked from here) are the OOM killer's first choice, never the trainer
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
sys.path.insert(0, sys.argv[1])
from riskpo_trl.code._judge_main import serve
serve(int(sys.argv[2]))
"""


@dataclass(frozen=True)
class JudgeLimits:
    """Resource limits of one judge process (judging one completion's report)."""

    timeout_s: float = 10.0  # wall clock, start-up included; then the judge is SIGKILLed and the completion fails
    cpu_time_s: int = 8  # RLIMIT_CPU
    memory_mb: int = 2048  # RLIMIT_AS

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"JudgeLimits.{name}={value} must be > 0.")
        for name in ("cpu_time_s", "memory_mb"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"JudgeLimits.{name}={getattr(self, name)!r} must be a whole number (an rlimit).")


@dataclass(frozen=True)
class Verdict:
    """Whether a completion passed all its tests, and if not, a short reason (at most a few hundred characters)."""

    passed: bool
    reason: str = ""


class _JudgeServer:
    """The judge server of this process (started on first use, restarted if it died or this process forked)."""

    _lock = threading.Lock()
    _current: _JudgeServer | None = None

    def __init__(self):
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", _BOOT, _PACKAGE_ROOT, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={"LANG": "C.UTF-8"},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.channel = ours

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def close(self) -> None:
        self.channel.close()
        if self.owner == os.getpid():
            self.process.wait()

    @classmethod
    def submit(cls, payload_fd: int, verdict_fd: int, limits: JudgeLimits) -> None:
        header = f"{limits.cpu_time_s} {limits.memory_mb << 20} {round(limits.timeout_s * 1000)}".encode()
        for attempt in (0, 1):
            with cls._lock:
                if cls._current is None or not cls._current.alive():
                    if cls._current is not None and cls._current.owner == os.getpid():
                        cls._current.close()
                    cls._current = cls()
                server = cls._current
            try:
                socket.send_fds(server.channel, [header], [payload_fd, verdict_fd])
                return
            except OSError:
                if attempt:
                    raise
                server.process.kill()  # broken: the next attempt starts a new one


def judge(spec_json: str, report: bytes, limits: JudgeLimits | None = None) -> Verdict:
    """Judge a run's ``report`` (the runner's raw bytes, `riskpo_trl.code.report`) against the test spec in a judge
    process. Returns within ``limits.timeout_s + DEADLINE_MARGIN_S``; raises `SandboxFault` when the judging machinery,
    not the report, kept a verdict from arriving."""
    limits = limits or JudgeLimits()
    deadline = time.monotonic() + limits.timeout_s + DEADLINE_MARGIN_S
    verdict_read, verdict_write = fork_safe.pipe()
    try:
        try:
            with anonymous_file() as payload:
                payload.write(spec_json.encode("utf-8", errors="surrogatepass"))
                payload.write(b"\n")
                payload.write(report)
                payload.flush()
                _JudgeServer.submit(payload.fileno(), verdict_write, limits)
        except OSError as exc:
            raise describe_os_error(exc, "handing a report to the judge") from exc
        fork_safe.close(verdict_write)
        verdict_write = None  # its number may be another thread's descriptor from here on
        verdict = _read_verdict(verdict_read, deadline)
    finally:
        fork_safe.close(verdict_read)
        if verdict_write is not None:
            fork_safe.close(verdict_write)
    if verdict is None:
        raise SandboxFault(
            f"no verdict from the judge within {limits.timeout_s:g} s + {DEADLINE_MARGIN_S:g} s (its server did not "
            "answer)",
            cause="judge: no verdict",
            fix="check that this machine has free CPU and memory for the judge processes",
        )
    if verdict == PASS:
        return Verdict(True)
    if verdict[:1] == FAIL:
        return Verdict(False, verdict[1:].decode("utf-8", errors="replace"))
    if verdict[:1] == UNSCORABLE:
        reason = verdict[1:].decode("utf-8", errors="replace")
        raise SandboxFault(f"the judge could not judge: {reason}", cause=f"judge: {reason.split(':')[0]}")
    raise SandboxFault("malformed verdict from the judge", cause="judge: malformed verdict")


def _read_verdict(fd: int, deadline: float) -> bytes | None:
    """The first whole message on the verdict pipe by ``deadline`` (at most `MAX_VERDICT_BYTES`); None on EOF before
    one, at the deadline, or on an oversized one. What follows it is not waited for: EOF is not needed, so a
    descriptor held elsewhere cannot delay the verdict."""
    data = b""
    while True:
        if len(data) >= LENGTH_BYTES:
            length = int.from_bytes(data[:LENGTH_BYTES], "big")
            if length > MAX_VERDICT_BYTES:
                return None
            if len(data) >= LENGTH_BYTES + length:
                return data[LENGTH_BYTES : LENGTH_BYTES + length]
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not readable(fd, remaining):
            return None
        chunk = os.read(fd, LENGTH_BYTES + MAX_VERDICT_BYTES - len(data))
        if not chunk:
            return None
        data += chunk
