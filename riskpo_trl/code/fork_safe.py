"""Descriptors that a forked child of the trainer must not keep: the pipes of the sandboxes made ready ahead.

``os.fork()`` copies every descriptor, ``O_CLOEXEC`` or not, and a DataLoader worker (fork start method),
``datasets.map(num_proc=...)`` or a ``multiprocessing.Pool`` forks without exec. A child holding the write end of a
held bwrap's option pipe keeps bwrap from ever seeing EOF there, so the run never starts. Every descriptor made here
is dropped in the child right after the fork (``os.register_at_fork``): replaced by ``/dev/null``, so that its number
stays taken and a later close of the parent's object in the child closes nothing of the child's own.

Making a descriptor and recording it happen under one lock that a fork also takes, so no fork falls between the two;
closing one and forgetting it likewise, so the child never drops a number the parent has since reused.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

_LOCK = threading.Lock()
_HELD: set[int] = set()


def pipe() -> tuple[int, int]:
    """``os.pipe()`` (close-on-exec), both ends dropped in a forked child."""
    with _LOCK:
        read, write = os.pipe()
        _HELD.update((read, write))
    return read, write


def open_fd(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CLOEXEC)``, dropped in a forked child."""
    with _LOCK:
        fd = os.open(path, flags | os.O_CLOEXEC)
        _HELD.add(fd)
    return fd


@contextmanager
def making() -> Iterator[None]:
    """Hold forks off while the block makes a descriptor that it then passes to `hold`."""
    with _LOCK:
        yield


def hold(fd: int) -> None:
    """Drop ``fd`` in a forked child (call inside `making`, where ``fd`` was made)."""
    _HELD.add(fd)


def close(fd: int) -> None:
    """Close a descriptor of this module (no-op if already closed here)."""
    with _LOCK:
        if fd in _HELD:
            _HELD.discard(fd)
            os.close(fd)


def close_file(file: IO) -> None:
    """Close a file object whose descriptor was passed to `hold`."""
    with _LOCK:
        if not file.closed:
            _HELD.discard(file.fileno())
            try:
                file.close()
            except OSError:  # its last flush failed (a full disk): the descriptor is closed all the same
                pass


def held() -> frozenset[int]:
    """The descriptors a fork now drops in the child."""
    with _LOCK:
        return frozenset(_HELD)


def _drop_in_child() -> None:
    try:
        if _HELD:
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            for fd in _HELD:
                try:
                    os.dup2(null, fd, inheritable=False)
                except OSError:
                    pass
            os.close(null)
        _HELD.clear()  # the child's copies are /dev/null now; the parent's objects close them or not, harmlessly
    finally:
        _LOCK.release()


os.register_at_fork(before=_LOCK.acquire, after_in_parent=_LOCK.release, after_in_child=_drop_in_child)
