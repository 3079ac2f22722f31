"""Faults of the machinery around a program, told apart from the program's own failures.

The executor contract (docs/code_sandbox.md) reserves ``Verdict(False)``, a score of 0.0, for what a program did:
a wrong answer, a crash, its own deadline, an output over its cap. Anything else that stops a verdict from arriving
(a sandbox or judge that cannot start, a full or unwritable disk, a broken pipe, a judge starved of CPU) raises a
`SandboxFault`: `CodeReward` scores that completion None (unscorable), warns once per cause, and stops training with
`SandboxUnavailableError` when the same cause leaves whole batches without a verdict.

The scoring path's temporary files are anonymous memory files (`anonymous_file`): they need no space in ``TMPDIR``,
so a full or read-only ``TMPDIR`` cannot fail a run, and they are closed on exec.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import IO

_DISK_ERRORS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only"}


class SandboxFault(RuntimeError):
    """The machinery failed, not the program: the completion is unscorable (None), never 0.0.

    ``cause`` is a short stable name of what failed (one warning per cause); ``fix`` says what to do about it when it
    persists."""

    def __init__(self, message: str, cause: str, fix: str = ""):
        super().__init__(message)
        self.cause = cause
        self.fix = fix


def describe_os_error(exc: OSError, what: str) -> SandboxFault:
    """A `SandboxFault` for an OSError of the machinery while doing ``what``, with the fix for a full disk."""
    kind = _DISK_ERRORS.get(exc.errno or 0)
    if kind is not None:
        return SandboxFault(
            f"{what}: {exc.strerror or exc} ({exc.filename or tempfile.gettempdir()})",
            cause=f"{what}: {kind}",
            fix="free space on (or point TMPDIR at) a writable file system with room",
        )
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return SandboxFault(f"{what}: {exc}", cause=f"{what}: {name}", fix="see the error above")


def anonymous_file() -> IO[bytes]:
    """A read-write binary file with no name: a memfd (memory, close-on-exec), else a temporary file in TMPDIR."""
    try:
        fd = os.memfd_create("riskpo-sandbox", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return tempfile.TemporaryFile()
    return os.fdopen(fd, "w+b")
