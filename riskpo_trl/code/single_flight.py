"""A least-recently-used cache where each key is computed once, however many threads ask for it at the same time.

`functools.lru_cache` does not lock while it computes: threads that miss the same key together all compute it. For
the code reward that multiplies a hostile dataset cell's folding cost by the number of workers scoring its
completions. Here the first thread computes and the others wait for its outcome. A `ValueError` (a refused or
unparseable cell: deterministic) is remembered like a value, without its traceback, and raised again as a fresh copy;
any other exception is not remembered, and the next caller computes again.

Standard library only: the judge process imports it too.
"""

from __future__ import annotations

import collections
import copy
import functools
import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


class CacheInfo(NamedTuple):
    hits: int  # answered from the cache, including callers that waited for another thread's computation
    misses: int  # computations started
    maxsize: int
    currsize: int


class SingleFlightCache(Generic[T]):
    """``cache(key)``: ``function(key)``, computed once per key while it stays among the ``maxsize`` latest."""

    def __init__(self, function: Callable[[Hashable], T], maxsize: int):
        self.function = function
        self.maxsize = maxsize
        functools.update_wrapper(self, function)
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a lock or flight of the parent's threads means nothing here

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: collections.OrderedDict[Hashable, tuple[bool, object]] = collections.OrderedDict()
        self._flights: dict[Hashable, threading.Event] = {}
        self._hits = self._misses = 0

    def __call__(self, key: Hashable) -> T:
        while True:
            with self._lock:
                outcome = self._outcomes.get(key)
                if outcome is not None:
                    self._outcomes.move_to_end(key)
                    self._hits += 1
                    break
                flight = self._flights.get(key)
                leader = flight is None
                if leader:
                    flight = self._flights[key] = threading.Event()
                    self._misses += 1
            if not leader:
                flight.wait()
                continue  # its outcome is cached now, or it raised something not remembered: compute it then
            try:
                outcome = (True, self.function(key))
            except ValueError as exc:
                outcome = (False, _bare(exc))
            except BaseException:
                self._land(key, flight, None)
                raise
            self._land(key, flight, outcome)
            break
        succeeded, value = outcome
        if succeeded:
            return value  # type: ignore[return-value]
        raise copy.copy(value)  # a fresh exception each time: raising one object again would grow its traceback

    def _land(self, key: Hashable, flight: threading.Event, outcome: tuple[bool, object] | None) -> None:
        with self._lock:
            if outcome is not None:
                self._outcomes[key] = outcome
                while len(self._outcomes) > self.maxsize:
                    self._outcomes.popitem(last=False)
            self._flights.pop(key, None)
        flight.set()

    def cache_info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, self.maxsize, len(self._outcomes))

    def cache_clear(self) -> None:
        with self._lock:
            self._outcomes.clear()
            self._hits = self._misses = 0


def _bare(exc: ValueError) -> ValueError:
    """``exc`` without what it holds on to: its traceback (the frames, and all they built) and its chained causes."""
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None
    return exc


def single_flight_cache(maxsize: int) -> Callable[[Callable[[Hashable], T]], SingleFlightCache[T]]:
    """Decorator: a `SingleFlightCache` of a one-argument function."""
    return lambda function: SingleFlightCache(function, maxsize)
