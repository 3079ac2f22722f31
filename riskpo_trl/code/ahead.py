"""One sandbox made ready ahead of its run per worker slot, prepared in the background while the slot's current run
goes on.

Getting a bubblewrap sandbox ready (its working directory, its cgroups, bwrap started and moved into them, held on its
option pipe) is mostly waiting: moving a process into a cgroup waits for the kernel (11-14 ms a run on the test
machine, docs/benchmarks.md section 4). Done for the next run while the current one runs, the wait costs the batch
nothing. Generic over what is prepared, so this module imports nothing of the sandbox.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Ready = TypeVar("Ready")


class ReadyAhead(Generic[Ready]):
    """At most one ready item per slot.

    Args:
        prepare: makes one item for a slot (may raise; then `take` prepares again in the caller's thread, so the
            caller sees the error).
        discard: frees an item that will not be used (never raises).
        usable: whether a ready item can still be used (for example, its process is still alive).
    """

    def __init__(
        self,
        prepare: Callable[[int], Ready],
        discard: Callable[[Ready], None],
        usable: Callable[[Ready], bool],
        workers: int,
    ):
        self._prepare, self._discard, self._usable = prepare, discard, usable
        self._workers = max(1, workers)
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._pending: dict[int, Future] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def _own(self) -> None:
        """In a process forked from the owner, forget the owner's items (they belong to its children) and threads."""
        if self._owner != os.getpid():
            self._owner, self._pending, self._executor = os.getpid(), {}, None

    def take(self, slot: int) -> Ready:
        """The slot's ready item (waiting for it if it is still being prepared), or a new one prepared now."""
        with self._lock:
            self._own()
            pending = self._pending.pop(slot, None)
        if pending is not None:
            try:
                item = pending.result()
            except Exception:  # noqa: BLE001 - prepared again below, in this thread, where the error is raised
                item = None
            if item is not None:
                if self._usable(item):
                    return item
                self._discard(item)
        return self._prepare(slot)

    def refill(self, slot: int) -> None:
        """Start preparing the slot's next item in the background (once per slot)."""
        with self._lock:
            self._own()
            if self._closed or slot in self._pending:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="sandbox-ahead")
            self._pending[slot] = self._executor.submit(self._prepare, slot)

    def close(self) -> None:
        """Discard every ready item (waiting for those still being prepared); later refills do nothing."""
        with self._lock:
            self._closed = True
            if self._owner != os.getpid():
                return
            pending, self._pending = list(self._pending.values()), {}
            executor, self._executor = self._executor, None
        for future in pending:
            try:
                item = future.result()
            except Exception:  # noqa: BLE001 - nothing was made
                continue
            self._discard(item)
        if executor is not None:
            executor.shutdown(wait=False)
