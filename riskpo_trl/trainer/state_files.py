"""Reading a small file the trainer trusts at start-up (a checkpoint's state, the run lock) without trusting what is
at its path: opened without following a link and without blocking, refused unless it is a regular file under a size
cap, then read whole. A symlink to ``/dev/zero``, a FIFO or a sparse file of gigabytes is refused by name instead of
being read until memory runs out or waited on for ever."""

from __future__ import annotations

import os
import stat

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


class UntrustedFileError(ValueError):
    """What is at a state file's path is not a regular file under its size cap; the message names it."""


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; raises FileNotFoundError when nothing is there, and
    `UntrustedFileError` for anything but a regular file of at most ``max_bytes`` (also one that grows past it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink (ELOOP), or something this user cannot open
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            raise UntrustedFileError(f"{path} cannot be opened ({exc.strerror}): check its permissions.") from exc
        fd = None
    try:
        status = os.fstat(fd) if fd is not None else os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            kind = _KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
            raise UntrustedFileError(f"{path} is {kind}, not a regular file: it is not read.")
        data = b""
        if status.st_size <= max_bytes:
            with os.fdopen(fd, "rb", closefd=False) as file:
                data = file.read(max_bytes + 1)
        if status.st_size > max_bytes or len(data) > max_bytes:
            raise UntrustedFileError(
                f"{path} holds {max(status.st_size, len(data))} bytes, over the {max_bytes} such a file can hold: "
                "it is not read."
            )
        return data
    finally:
        if fd is not None:
            os.close(fd)
