"""The judge: a separate, bounded process that decides whether a run's report passes its tests.

Everything that touches a value a program produced (parsing its report, decoding JSON into Python values, hashing,
comparing, evaluating assert-style probes over it) happens in a judge process, never in the trainer's interpreter:
a program can make those steps cost seconds of CPU held under the GIL (colliding hashes) or gigabytes (``%``
formatting, sequence repetition), which in the trainer would stall or starve every concurrent completion.

One judge per judgement: ``python -I -S -B`` loading only this package's stdlib-only modules
(`riskpo_trl.code._judge_main`), with its own RLIMIT_CPU and RLIMIT_AS set before it reads anything, and a
wall-clock deadline after which the trainer SIGKILLs it. It reads the test spec (expected values included) and the
report from an unnamed file on stdin, and writes a verdict of at most `MAX_VERDICT_BYTES`; the trainer reads no more
than that. No program runs in it: the judge only ever receives the bytes the sandbox reported. A judge that overruns,
dies or writes anything else is a failed test for that completion only.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_VERDICT_BYTES = 512
PASS, FAIL = b"P", b"F"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding riskpo_trl/
# Registers riskpo_trl and riskpo_trl.code as bare namespaces, so that only the judge's own modules are imported
# (not the package's __init__, which would pull in torch): start-up stays in tens of milliseconds.
_BOOT = """
import resource, sys, types
cpu, memory = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
for name, sub in (("riskpo_trl", ""), ("riskpo_trl.code", "/code")):
    module = types.ModuleType(name)
    module.__path__ = [sys.argv[1] + "/riskpo_trl" + sub]
    sys.modules[name] = module
from riskpo_trl.code._judge_main import main
main()
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


@dataclass(frozen=True)
class Verdict:
    """Whether a completion passed all its tests, and if not, a short reason (at most a few hundred characters)."""

    passed: bool
    reason: str = ""


def judge(spec_json: str, report: bytes, limits: JudgeLimits | None = None) -> Verdict:
    """Judge a run's ``report`` (the runner's raw bytes, `riskpo_trl.code.report`) against the test spec in a judge
    process. Returns within ``limits.timeout_s`` plus the time to kill and reap a process."""
    limits = limits or JudgeLimits()
    deadline = time.monotonic() + limits.timeout_s
    argv = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", _BOOT, _PACKAGE_ROOT,
            str(limits.cpu_time_s), str(limits.memory_mb << 20)]
    with tempfile.TemporaryFile() as payload:
        payload.write(spec_json.encode("utf-8", errors="surrogatepass"))
        payload.write(b"\n")
        payload.write(report)
        payload.seek(0)
        process = subprocess.Popen(argv, stdin=payload, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   cwd="/", env={"LANG": "C.UTF-8"})
    try:
        verdict = _read_verdict(process.stdout.fileno(), deadline)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()
    if verdict is None:
        return Verdict(False, f"judge: no verdict within {limits.timeout_s:g} s or its CPU/memory limits "
                              f"(exit {process.returncode})")
    if verdict[:1] == PASS and len(verdict) == 1:
        return Verdict(True)
    if verdict[:1] == FAIL:
        return Verdict(False, verdict[1:].decode("utf-8", errors="replace"))
    return Verdict(False, "judge: malformed verdict")


def _read_verdict(fd: int, deadline: float) -> bytes | None:
    """The judge's whole output if it ends (EOF) by ``deadline`` within `MAX_VERDICT_BYTES`; else None."""
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, MAX_VERDICT_BYTES + 1 - len(data))
        if not chunk:
            return data or None
        data += chunk
        if len(data) > MAX_VERDICT_BYTES:
            return None
