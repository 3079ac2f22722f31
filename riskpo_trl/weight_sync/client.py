"""The trainer side: TRL's `VLLMClient` with the weights sent over gloo and checked, and the hook that gives it to the
trainers.

`serve_weights_to_cpu_servers` wraps a trainer's construction (every trainer of this package: RiskPO and the GRPO/GMPO
baselines). In server mode TRL then opens its client through `open_client`, which reads the server's weight-transfer
backend: for ``BACKEND`` it returns a `GlooVLLMClient`, for any other backend TRL's own client, untouched (the CUDA
path stays TRL's). Only the TRL 1.16 protocol is supported: with an older TRL, server mode on a trainer without CUDA is
refused at start-up (TRL's own NCCL path on CUDA is unaffected). `check_weight_syncs` (weight_sync.probe) then adds the
log-prob probe after each sync.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import sys
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .. import compat
from . import BACKEND, SERVER_ARGS
from .checksums import checksum, same_checksum
from .gloo import DEFAULT_TIMEOUT_S, address_towards, broadcast_from_trainer, open_group, open_store

# GlooWeightSyncExtension's methods, called through /collective_rpc.
HELD_WEIGHTS_METHOD = "riskpo_held_weights"
IDENTITY_METHOD = "riskpo_identity"
# The server's workers join the weight-sync group within this many seconds of being asked, or the set-up fails.
SETUP_TIMEOUT_S = 120.0
# Connecting to the server for a control call (the weight sync's requests and checks) fails after this many seconds;
# its answer may take up to the transfer's DEFAULT_TIMEOUT_S (a large model's update or check).
CONNECT_TIMEOUT_S = 10.0
# A short control call (the server's identity, its settings) gets this long to answer.
QUICK_TIMEOUT_S = 60.0


class WeightSyncError(RuntimeError):
    """The server does not generate with the weights the trainer sent: an update that did not land, a server that was
    replaced, or a sync that broke off."""


class ServerRefusedError(ValueError):
    """At start-up: a server this trainer cannot sync its weights to safely (the fix is in the message)."""


@contextlib.contextmanager
def serve_weights_to_cpu_servers(args: Any) -> Iterator[None]:
    """While a trainer is built with ``args``: in vLLM server mode, TRL opens its server client through
    `open_client`. Outside server mode this does nothing."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"):
        yield
        return
    on_cuda = torch.cuda.is_available() and not getattr(args, "use_cpu", False)
    if not compat.trl_serves_weight_transfer_engines():
        if not on_cuda:
            raise ValueError(
                f"vLLM server mode without CUDA needs TRL 1.16 (installed: trl {compat.installed_version('trl')}): "
                "older TRL releases sync the server's weights over NCCL only. Install trl==1.16.*, or train with "
                "use_vllm=False or vllm_mode='colocate'."
            )
        yield  # TRL's own server protocol and client
        return
    module = compat.trl_vllm_generation_module()
    trl_client_class = module.VLLMClient
    if isinstance(trl_client_class, functools.partial) and trl_client_class.func is open_client:
        yield  # a trainer built inside the training script's hook
        return
    module.VLLMClient = functools.partial(open_client, trl_client_class, on_cuda)
    try:
        yield
    finally:
        module.VLLMClient = trl_client_class


def open_client(trl_client_class: type, on_cuda: bool, *args: Any, **kwargs: Any) -> Any:
    """A `GlooVLLMClient` when the server syncs weights with ``BACKEND``, else TRL's client (``trl_client_class``),
    which reports a server without weight transfer itself; refuses a CUDA-only backend on a trainer without CUDA."""
    announce_wait(*args, **kwargs)
    client = trl_client_class(*args, **kwargs)
    backend = served_backend(client)
    if backend == BACKEND:
        client.session.close()
        return gloo_client_class()(*args, **kwargs)
    if backend is not None and not on_cuda:
        raise ServerRefusedError(
            f"The vLLM server at {client.base_url} syncs weights with its {backend!r} engine, which needs CUDA, and "
            f"this trainer runs without CUDA. Serve with this package's CPU engine: add --vllm-args "
            f'"{" ".join(SERVER_ARGS)}" to examples/launch/launch_single_node.sh, or these arguments to '
            "`trl vllm-serve` (docs/scale_out.md)."
        )
    return client


def announce_wait(
    base_url: str | None = None,
    host: str = "0.0.0.0",
    server_port: int = 8000,
    connection_timeout: float = 0.0,
    **_: Any,
) -> None:
    """One line on stderr when the server does not answer at once (TRL's client then waits ``connection_timeout``
    seconds without a word, and fails with a message naming the address)."""
    url = (base_url or f"http://{host}:{server_port}").rstrip("/")
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):
            return
    except (OSError, ValueError):  # refused, timed out, an error status, a malformed address
        pass
    print(
        f"Waiting up to {connection_timeout:g} s for the vLLM server at {url} (vllm_server_timeout) ...",
        file=sys.stderr,
        flush=True,
    )


def served_backend(client: Any) -> str | None:
    """The server's weight-transfer backend, or None when it has none or hides its development endpoints."""
    try:
        config = client.get_server_info().get("weight_transfer_config")
    except RuntimeError:  # no VLLM_SERVER_DEV_MODE: TRL's client says so when it opens the weight sync
        return None
    return config.get("backend") if isinstance(config, dict) else None


@functools.cache
def gloo_client_class() -> type:
    """`GlooVLLMClient`, built on the installed TRL's `VLLMClient` (imported only when a server asks for it)."""
    import requests

    VLLMClient = compat.trl_vllm_client_class()  # noqa: N806

    class GlooVLLMClient(VLLMClient):
        """TRL's client, with the weight sync over a gloo group to a server running `GlooWeightTransferEngine`, and
        checked.

        Generation and the prompt log-probs are TRL's. The weight sync's requests go without TRL's retries and with
        timeouts (`control`). The client records the server's identity when the sync is set up and checks it before
        each generation, after it (before its completions are used) and before each sync: a restarted or replaced
        server is `WeightSyncError`. When an update finishes, the server reports every parameter as its generation
        uses it, under the trainer's names (`compare_held`); anything but what was sent is `WeightSyncError`.
        """

        timeout_s = DEFAULT_TIMEOUT_S
        setup_timeout_s = SETUP_TIMEOUT_S

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._control_session = requests.Session()  # no retries: a weight-sync request must not run twice
            self.identity: dict[str, Any] | None = None
            self.server_dtype: str | None = None
            self._sent: dict[str, tuple[list[int], list[float]]] = {}

        def control(self, method: str, path: str, timeout: float | None = None, **kwargs: Any) -> Any:
            """One request of the weight sync; a network error, a timeout or an error status is `WeightSyncError`
            naming the server and the request."""
            try:
                response = self._control_session.request(
                    method, f"{self.base_url}{path}", timeout=(CONNECT_TIMEOUT_S, timeout or self.timeout_s), **kwargs
                )
            except requests.RequestException as error:
                raise WeightSyncError(f"The vLLM server at {self.base_url} did not answer {path}: {error}") from error
            if response.status_code != 200:
                raise WeightSyncError(
                    f"The vLLM server at {self.base_url} answered {path} with "
                    f"{response.status_code}: {response.text[:500]}"
                )
            return response.json() if response.content else None

        def init_communicator(self, device: Any = 0) -> None:
            # ``device`` is where TRL's NCCL group would run; gloo sends from CPU whatever the trainer's device.
            info = self.server_config()
            self.server_dtype = str(info["model_config"]["dtype"]).removeprefix("torch.")
            tensor_parallel = (info.get("parallel_config") or {}).get("tensor_parallel_size", 1)
            if tensor_parallel != 1:
                raise ServerRefusedError(
                    f"The vLLM server at {self.base_url} shards its model over {tensor_parallel} workers "
                    "(--tensor_parallel_size): the CPU weight sync checks whole tensors. Serve with --tp 1 "
                    "(data parallel replicas are fine)."
                )
            world_size = self.control("GET", "/get_world_size", QUICK_TIMEOUT_S)["world_size"] + 1
            address = address_towards(self.host)
            try:  # before the server is asked to join: a taken port fails here, not in the server's rendezvous
                store = open_store(address, self.group_port, 0, world_size, self.setup_timeout_s)
            except RuntimeError as error:
                raise ServerRefusedError(
                    f"The weight-sync group port {self.group_port} on {address} cannot be opened ({error}). Another "
                    "process holds it: pick a free port with --vllm_group_port (vllm_group_port in the recipe)."
                ) from None
            init_info = {
                "master_address": address,
                "master_port": self.group_port,
                "rank_offset": 1,
                "world_size": world_size,
                "timeout_s": self.setup_timeout_s,
                "transfer_timeout_s": self.timeout_s,
            }
            with ThreadPoolExecutor(max_workers=1) as pool:
                # The server's workers join while this request is handled, so it returns once everyone has joined.
                answered = pool.submit(
                    self.control,
                    "POST",
                    "/init_weight_transfer_engine",
                    self.setup_timeout_s,
                    json={"init_info": init_info},
                )
                try:
                    group = open_group(address, self.group_port, 0, world_size, self.setup_timeout_s, store=store)
                except Exception as error:
                    server_error = answered.exception()
                    raise WeightSyncError(
                        f"The vLLM server at {self.base_url} did not join the weight-sync group on {address}:"
                        f"{self.group_port} within {self.setup_timeout_s:g} s: {server_error or error}"
                    ) from error
                answered.result()
            self.communicator = group
            self.identity = self.server_identity()
            atexit.register(self.close_communicator)

        def server_config(self) -> dict[str, Any]:
            """The server's resolved vLLM config (``/server_info``)."""
            info = self.control("GET", "/server_info", QUICK_TIMEOUT_S, params={"config_format": "json"})
            return info["vllm_config"]

        def server_identity(self) -> dict[str, Any]:
            """The server's instance id (vLLM's, drawn from the clock at its start) and its workers' nonces and
            PIDs."""
            workers = self.control("POST", "/collective_rpc", QUICK_TIMEOUT_S, json={"method": IDENTITY_METHOD})
            return {"instance_id": self.server_config().get("instance_id"), "workers": workers["results"]}

        def check_identity(self, before: str) -> None:
            """`WeightSyncError` unless the server's workers are the processes the sync was set up with."""
            if self.identity is None:
                return
            try:
                current = self.server_identity()
            except WeightSyncError as error:
                raise WeightSyncError(f"Before {before}: {error}") from error
            if current != self.identity:
                raise WeightSyncError(
                    f"Before {before}: the vLLM server at {self.base_url} is not the one this trainer synced its "
                    f"weights to ({self.identity} at set-up, now {current}): it was restarted or replaced, and "
                    "generates with other weights. Nothing it generated was trained on; restart the training, which "
                    "resumes from the last checkpoint."
                )

        def generate(self, *args: Any, **kwargs: Any) -> dict[str, list]:
            self.check_identity("generation")
            output = super().generate(*args, **kwargs)
            self.check_identity("training on its completions")
            return output

        def update_named_params(
            self, metadata: list[tuple[str, str, list[int]]], named_params: Iterable[tuple[str, torch.Tensor]]
        ) -> None:
            self.check_identity("the weight sync")
            names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
            update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
            if not self._updating_weights:
                self._start_weight_update()
            self._transfer(update_info, self._recorded(named_params))
            if not self._updating_weights:
                self._finish_weight_update()

        def _transfer(self, update_info: dict[str, list], named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
            """The server receives while this process broadcasts, so its request runs on a side thread."""
            with ThreadPoolExecutor(max_workers=1) as pool:
                received = pool.submit(self.control, "POST", "/update_weights", json={"update_info": update_info})
                try:
                    for _, tensor in named_params:
                        broadcast_from_trainer(self.communicator, tensor, self.timeout_s)
                except RuntimeError as error:  # gloo: the peer closed the connection or timed out
                    raise WeightSyncError(
                        f"The weight transfer to the vLLM server at {self.base_url} broke off: {error}"
                    ) from error
                received.result()

        def _recorded(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            """The tensors to send (contiguous, on CPU), with their checksums in the server's dtype."""
            dtype = getattr(torch, self.server_dtype or "float32")
            for name, tensor in named_params:
                tensor = tensor.detach().to("cpu").contiguous()
                self._sent[name] = (list(tensor.shape), checksum(tensor.to(dtype)))
                yield name, tensor

        def _start_weight_update(self) -> None:
            self._sent = {}
            self.control("POST", "/start_weight_update", json={})

        def _finish_weight_update(self) -> None:
            self.control("POST", "/finish_weight_update", json={})
            sent, self._sent = self._sent, {}
            self.verify(sent)

        def verify(self, sent: dict[str, tuple[list[int], list[float]]]) -> None:
            held = self.control("POST", "/collective_rpc", json={"method": HELD_WEIGHTS_METHOD})["results"]
            problems = compare_held(sent, held)
            if problems:
                listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
                raise WeightSyncError(
                    f"After the weight update the vLLM server at {self.base_url} does not generate with what the "
                    f"trainer sent ({len(problems)} problems): {listed}"
                )

        def reset_prefix_cache(self) -> None:
            self.control("POST", "/reset_prefix_cache")

        def probe_logprobs(self, token_ids: list[int]) -> list[float]:
            """The server's log-prob of each token of ``token_ids`` after the first (temperature 1)."""
            served = self.get_sequence_logprobs([token_ids], [1], top_logprobs=1)["actual_logprobs"][0]
            return [position[0] for position in served]

        def close_communicator(self) -> None:
            self.communicator = None

    return GlooVLLMClient


def compare_held(sent: dict[str, tuple[list[int], list[float]]], per_worker: list[list[dict[str, Any]]]) -> list[str]:
    """What differs between the tensors sent (name -> shape, `checksum`) and each worker's `held_weights` report:
    a parameter held as other values, in another shape, unreadable, or under a name nothing was sent for, and a sent
    name no worker holds. Empty when the server generates with exactly what was sent."""
    problems = []
    for worker, entries in enumerate(per_worker):
        covered = set()
        for entry in entries:
            name, where = entry["name"], f"{entry['held_as']} on worker {worker}"
            if name not in sent:
                problems.append(f"{where} (as {name}): no tensor of that name was sent, so no sync updates it")
                continue
            covered.add(name)
            shape, value = sent[name]
            if entry["checksum"] is None:
                problems.append(f"{where} (as {name}): empty, and cannot be read back")
            elif entry["shape"] != shape:
                problems.append(f"{where} (as {name}): shape {entry['shape']}, sent {shape}")
            elif not same_checksum(value, entry["checksum"]):
                problems.append(f"{where} (as {name}): checksum {entry['checksum']}, sent {value}")
        problems.extend(
            f"{name}: worker {worker} holds nothing under this name" for name in sent if name not in covered
        )
    return problems
