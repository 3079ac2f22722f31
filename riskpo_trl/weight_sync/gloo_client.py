"""`GlooVLLMClient`: TRL's `VLLMClient` with its requests bounded, the weights sent over a gloo group to a server
running `GlooWeightTransferEngine`, and checked (`CheckedClientMixin`). Imported only when a server asks for it."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from ..compat import serving
from .bounded import (
    QUICK_TIMEOUT_S,
    BoundedRequestsMixin,
    ServerRefusedError,
    ServerTimeoutError,
    WeightSyncError,
    error_text,
    interruptible_wait,
)
from .checked import ABORT_METHOD, CheckedClientMixin, drain
from .gloo import address_towards, broadcast_from_trainer, open_group, open_store

# The server's workers join the weight-sync group within this many seconds of being asked, or the set-up fails.
SETUP_TIMEOUT_S = 120.0
# A trainer that owns a server answers on its group port within this many seconds.
OWNER_PROBE_TIMEOUT_S = 2.0


class GlooVLLMClient(CheckedClientMixin, BoundedRequestsMixin, serving.trl_vllm_client_class()):
    """TRL's client, with the weight sync over a gloo group, and checked.

    Generation and the prompt log-probs are TRL's, bounded in time. Set-up (`init_communicator`) refuses a server
    another live trainer owns, aborts a sync a dead one left unfinished, and joins the group; each sync
    (`update_named_params`) checks the server's identity, sends the tensors one by one, and verifies them every
    ``check_every`` syncs.
    """

    setup_timeout_s = SETUP_TIMEOUT_S

    def init_communicator(self, device: Any = 0) -> None:
        # ``device`` is where TRL's NCCL group would run; gloo sends from CPU whatever the trainer's device.
        world_size = self.check_server_config()
        self.refuse_if_owned()
        self.control("POST", "/collective_rpc", QUICK_TIMEOUT_S, json={"method": ABORT_METHOD})
        address = address_towards(self.host)
        store = self.open_group_store(address, world_size)
        self.communicator = self.join_group(address, world_size, store)
        self.identity = self.server_identity()
        # No atexit hook, as TRL's NCCL client has: it would keep the group, and its port, alive as long as the
        # process, past the trainer that owns it. Process exit closes the group's sockets.

    def check_server_config(self) -> int:
        """Records the server's dtype; refuses a sharded server; returns the group's size (the server's workers and
        this trainer)."""
        info = self.read_server_config()
        tensor_parallel = (info.get("parallel_config") or {}).get("tensor_parallel_size", 1)
        if tensor_parallel != 1:
            raise ServerRefusedError(
                f"The vLLM server at {self.base_url} shards its model over {tensor_parallel} workers "
                "(--tensor_parallel_size): the CPU weight sync checks whole tensors. Serve with --tp 1 "
                "(data parallel replicas are fine)."
            )
        return self.control("GET", "/get_world_size", QUICK_TIMEOUT_S, read_only=True)["world_size"] + 1

    def refuse_if_owned(self) -> None:
        """`ServerRefusedError` naming the other trainer when a live one (its group port answers) owns the server;
        a dead owner's server (a run that stopped, then resumes) is taken over."""
        for state in self.server_state(QUICK_TIMEOUT_S):
            owner = state.get("owner")
            if owner and owner.get("trainer") != this_trainer() and _answers(owner["address"], owner["port"]):
                raise ServerRefusedError(
                    f"The vLLM server at {self.base_url} already syncs weights with another trainer "
                    f"({owner.get('trainer') or 'a trainer'} at {owner['address']}, group port {owner['port']}), "
                    "which is still running. One trainer per server: start a server of its own for this run (another "
                    "--port), or stop that trainer first."
                )

    def open_group_store(self, address: str, world_size: int) -> Any:
        """The group's store, hosted here before the server is asked to join: a taken port fails here, not in the
        server's rendezvous."""
        try:
            return open_store(address, self.group_port, 0, world_size, self.setup_timeout_s)
        except RuntimeError as error:
            raise ServerRefusedError(
                f"The weight-sync group port {self.group_port} on {address} cannot be opened ({error}). Another "
                "process holds it: pick a free port with --vllm_group_port (vllm_group_port in the recipe)."
            ) from None

    def join_group(self, address: str, world_size: int, store: Any) -> Any:
        init_info = {
            "master_address": address,
            "master_port": self.group_port,
            "rank_offset": 1,
            "world_size": world_size,
            "timeout_s": self.setup_timeout_s,
            "transfer_timeout_s": self.settings.sync_timeout_s,
            "trainer": this_trainer(),
        }
        # The server's workers join while this request is handled, so it returns once everyone has joined.
        answered = on_daemon_thread(
            self.control, "POST", "/init_weight_transfer_engine", self.setup_timeout_s, json={"init_info": init_info}
        )
        try:
            group = open_group(address, self.group_port, 0, world_size, self.setup_timeout_s, store=store)
        except Exception as error:
            try:
                server_error = answered.exception(timeout=QUICK_TIMEOUT_S)
            except FutureTimeout:
                server_error = None
            raise WeightSyncError(
                f"The vLLM server at {self.base_url} did not join the weight-sync group on {address}:"
                f"{self.group_port} within {self.setup_timeout_s:g} s: {error_text(server_error or error)}"
            ) from error
        try:
            with interruptible_wait():
                answered.result(timeout=self.setup_timeout_s)
        except FutureTimeout as error:
            what = "the weight-sync set-up"
            raise self.timed_out("/init_weight_transfer_engine", what, self.setup_timeout_s, error) from error
        return group

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
        update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
        named_params = iter(named_params)
        try:
            self.check_identity("the weight sync")
            if not self._updating_weights:
                self._start_weight_update()
            try:
                self._transfer(update_info, self.recorded(named_params))
            except WeightSyncError as error:
                raise self.with_server_state(error) from error
            if not self._updating_weights:
                self._finish_weight_update()
        except BaseException:
            drain(named_params)
            raise

    def _transfer(self, update_info: dict[str, list], named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The server receives while this process broadcasts, so its request runs on a side thread. Each tensor's
        broadcast waits at most the sync timeout, and so does the server's answer after the last one."""
        timeout = self.settings.sync_timeout_s
        received = on_daemon_thread(
            self.control,
            "POST",
            "/update_weights",
            timeout * (1 + len(update_info["names"])),
            json={"update_info": update_info},
        )
        try:
            for _, tensor in named_params:
                with interruptible_wait():  # the wait only: a stop never cuts into a parameter's gather
                    broadcast_from_trainer(self.communicator, tensor, timeout)
            with interruptible_wait():
                received.result(timeout=timeout)
        except RuntimeError as error:  # gloo: the peer closed the connection or timed out
            self.close_communicator()  # a broken group: its sockets close, so the server's receive fails at once
            kind = ServerTimeoutError if "Timed out" in str(error) else WeightSyncError
            raise kind(
                f"The weight transfer to the vLLM server at {self.base_url} broke off "
                f"(transfer timeout {timeout:g} s, vllm_sync_timeout): {error_text(error)}"
            ) from error
        except FutureTimeout as error:
            self.close_communicator()
            raise self.timed_out("/update_weights", "the end of a weight transfer", timeout, error) from error
        except BaseException:  # a stop signal while sending: the group is left mid-transfer
            self.close_communicator()
            raise

    def prepare_for_sending(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu").contiguous()

    def reset_prefix_cache(self) -> None:
        self.control("POST", "/reset_prefix_cache")

    def close_communicator(self) -> None:
        """Drop the group: its sockets and the store's port close once nothing else holds it."""
        self.communicator = None


def on_daemon_thread(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """``call(*args, **kwargs)`` on a daemon thread; its result or error in the returned future. A request abandoned
    after a timeout or a stop keeps no process alive (an executor's threads are joined at exit, however long their
    request's own timeout)."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call(*args, **kwargs))
        except BaseException as error:  # reported through the future
            future.set_exception(error)

    threading.Thread(target=run, name="riskpo-weight-sync-request", daemon=True).start()
    return future


def this_trainer() -> str:
    """How the server records this process as its owner (an earlier client of the same process is no other trainer)."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def _answers(address: str, port: int) -> bool:
    """Whether something listens on ``address:port`` (the group store of a live trainer)."""
    try:
        with socket.create_connection((address, port), timeout=OWNER_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
