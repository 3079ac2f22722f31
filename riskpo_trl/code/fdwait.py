"""Waiting on file descriptors with ``poll``: ``select.select`` refuses descriptors numbered 1,024 and up, which a
trainer holding many files, sockets or GPU handles (or many sandbox workers) reaches.

Standard library only: the judge server imports it too.
"""

from __future__ import annotations

import math
import select


def poll_ms(timeout_s: float | None) -> int | None:
    """A timeout in seconds as poll's whole milliseconds, rounded up (a wait never ends early); None waits forever."""
    return None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))


def readable(fd: int, timeout_s: float | None) -> bool:
    """Whether ``fd`` turns readable (data, EOF or an error) within ``timeout_s`` seconds (None: no limit)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(poll_ms(timeout_s)))
