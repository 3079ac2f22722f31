"""The gloo group that carries the weights: the trainer is rank 0 and hosts the rendezvous store, the server's workers
join it after the trainer. Plain torch.distributed objects, outside the default process group, so neither side's
own distributed set-up (accelerate's, vLLM's) is touched."""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time

import torch
from torch.distributed import BroadcastOptions, PrefixStore, ProcessGroupGloo, TCPStore

# Every broadcast waits at most this long: a peer that died fails the sync instead of hanging it.
DEFAULT_TIMEOUT_S = 600.0
_STORE_PREFIX = "riskpo-weight-sync"


def open_store(address: str, port: int, rank: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> TCPStore:
    """The group's rendezvous store: rank 0 hosts it on ``port`` (and fails at once, with ``DistNetworkError``, when
    the port is taken), the others connect to it."""
    return TCPStore(
        address,
        port,
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def open_group(
    address: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    store: TCPStore | None = None,
) -> ProcessGroupGloo:
    """Join the group; blocks until all ``world_size`` ranks have joined, at most ``timeout_s`` (the group's default
    for its operations too; `broadcast_from_trainer` sets its own). ``store`` is one `open_store` made before. The
    interface gloo uses is the host name's, or those named by ``GLOO_SOCKET_IFNAME`` (as for torch.distributed)."""
    store = store if store is not None else open_store(address, port, rank, world_size, timeout_s)
    return ProcessGroupGloo(PrefixStore(_STORE_PREFIX, store), rank, world_size, datetime.timedelta(seconds=timeout_s))


def broadcast_from_trainer(
    group: ProcessGroupGloo, tensor: torch.Tensor, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Send ``tensor`` (on rank 0) or receive into it (elsewhere); returns when this rank's part is done, or fails
    after ``timeout_s``."""
    options = BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    options.timeout = datetime.timedelta(seconds=timeout_s)
    work = group.broadcast([tensor], options)
    if threading.current_thread() is threading.main_thread():
        try:
            wait_interruptibly(work)
        except BaseException:  # a stop signal: the broadcast goes on in gloo's thread until it ends or times out
            keep_until_done(group, work)
            raise
    work.wait()  # raises the transfer's error, if any


def keep_until_done(group: ProcessGroupGloo, work) -> None:
    """Hold ``group`` on a daemon thread until ``work``, abandoned, ends (done, failed, or gloo's own timeout). The
    group's destructor joins gloo's worker threads, so the last reference to it dropped while a broadcast is pending
    blocks until that broadcast's timeout (the sync timeout): a stop's traceback freed by the garbage collector, at
    any point of the main thread, held two-process runs 25 s past their stop line that way."""

    def hold(group: ProcessGroupGloo, work) -> None:  # the thread's arguments: released when it ends
        with contextlib.suppress(Exception):  # its error was the transfer's, which the stop abandoned
            work.wait()

    threading.Thread(target=hold, args=(group, work), name="riskpo-abandoned-transfer", daemon=True).start()


def wait_interruptibly(work) -> None:
    """Until ``work`` completes (done, failed or timed out on gloo's own thread): the main thread sleeps in short
    steps instead of blocking inside gloo, so that a signal's handler runs at once (a stop while a transfer hangs,
    a second Ctrl-C). The first polls are quick: a small tensor's broadcast takes microseconds."""
    pause = 1e-5
    while not work.is_completed():
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host``: the address the server reaches the trainer at (127.0.0.1 when
    the server runs here). No packet is sent."""
    target = "127.0.0.1" if host in ("", "0.0.0.0", "localhost", "::") else host
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))
        return probe.getsockname()[0]
