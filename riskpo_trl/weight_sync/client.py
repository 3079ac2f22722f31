"""The trainer side: TRL's `VLLMClient` with the weights sent over gloo, and the hook that gives it to the trainers.

`serve_weights_to_cpu_servers` wraps a trainer's construction (RiskPOTrainer's, and the training script's for the
GRPO/GMPO baselines). In server mode TRL then opens its client through `open_client`, which reads the server's
weight-transfer backend: for ``BACKEND`` it returns a `GlooVLLMClient`, for any other backend TRL's own client,
untouched (the CUDA path stays TRL's). Only the TRL 1.16 protocol is supported: with an older TRL, server mode on a
trainer without CUDA is refused at start-up (TRL's own NCCL path on CUDA is unaffected).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .. import compat
from . import BACKEND, SERVER_ARGS
from .checksums import checksum, same_checksum
from .gloo import DEFAULT_TIMEOUT_S, address_towards, broadcast_from_trainer, open_group

CHECKSUM_METHOD = "riskpo_weight_checksums"  # GlooWeightSyncExtension's, called through /collective_rpc


class WeightSyncError(RuntimeError):
    """After an update the server does not hold what the trainer sent."""


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
    client = trl_client_class(*args, **kwargs)
    backend = served_backend(client)
    if backend == BACKEND:
        client.session.close()
        return gloo_client_class()(*args, **kwargs)
    if backend is not None and not on_cuda:
        raise RuntimeError(
            f"The vLLM server at {client.base_url} syncs weights with its {backend!r} engine, which needs CUDA, and "
            f"this trainer runs without CUDA. Serve with this package's CPU engine: add --vllm-args "
            f"\"{' '.join(SERVER_ARGS)}\" to examples/launch/launch_single_node.sh, or these arguments to "
            "`trl vllm-serve` (docs/scale_out.md)."
        )
    return client


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
    VLLMClient = compat.trl_vllm_client_class()  # noqa: N806

    class GlooVLLMClient(VLLMClient):
        """TRL's client, with the weight sync over a gloo group to a server running `GlooWeightTransferEngine`.

        Generation, prefix-cache reset and the update's start/finish requests are TRL's. Tensors go one by one,
        from CPU. When an update finishes, the server's checksums of the parameters it holds under the trainer's
        names and shapes (embeddings and norms on a CPU server, where vLLM packs the linear layers away) must equal
        those of what was sent, or `WeightSyncError` is raised: a sync that moved nothing cannot pass.
        """

        timeout_s = DEFAULT_TIMEOUT_S

        def init_communicator(self, device: Any = 0) -> None:
            # ``device`` is where TRL's NCCL group would run; gloo sends from CPU whatever the trainer's device.
            world_size = self.get_world_size() + 1
            address = address_towards(self.host)
            init_info = {"master_address": address, "master_port": self.group_port, "rank_offset": 1,
                         "world_size": world_size, "timeout_s": self.timeout_s}
            opened: dict[str, Any] = {}

            def join() -> None:
                try:
                    opened["group"] = open_group(address, self.group_port, 0, world_size, self.timeout_s)
                except Exception as error:  # reported below, after the server's own answer
                    opened["error"] = error

            joining = threading.Thread(target=join, name="riskpo-weight-sync-rendezvous", daemon=True)
            joining.start()
            # The server's workers join while this request is handled, so it returns once everyone has joined.
            self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": init_info})
            joining.join(self.timeout_s)
            if "group" not in opened:
                raise RuntimeError(f"The trainer could not join the weight-sync group on {address}:"
                                   f"{self.group_port}: {opened.get('error', 'timed out')}")
            self.communicator = opened["group"]
            self._checkable = self._common_parameters(self._server_checksums(None))
            self._sent_checksums: dict[str, list[float]] = {}
            atexit.register(self.close_communicator)

        def update_named_params(self, metadata: list[tuple[str, str, list[int]]],
                                named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
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
                received = pool.submit(self._post, f"{self.base_url}/update_weights",
                                       json={"update_info": update_info})
                for _, tensor in named_params:
                    broadcast_from_trainer(self.communicator, tensor)
                received.result()

        def _recorded(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            """The tensors to send (contiguous, on CPU), with the checksums of those the server can report."""
            for name, tensor in named_params:
                tensor = tensor.detach().to("cpu").contiguous()
                held = self._checkable.get(name)
                if held is not None and list(tensor.shape) == held[1]:
                    self._sent_checksums[name] = checksum(tensor.to(getattr(torch, held[0])))
                yield name, tensor

        def _finish_weight_update(self) -> None:
            super()._finish_weight_update()
            sent, self._sent_checksums = self._sent_checksums, {}
            self._verify(sent)

        def _verify(self, sent: dict[str, list[float]]) -> None:
            if not sent:
                raise WeightSyncError(
                    "The weight update cannot be verified: the vLLM server holds none of the updated parameters under "
                    "the trainer's name and shape, so a sync that moved nothing would pass unnoticed."
                )
            stale = []
            for worker, held in enumerate(self._server_checksums(sorted(sent))):
                for name, value in sent.items():
                    if name not in held or not same_checksum(value, held[name]["checksum"]):
                        reported = held[name]["checksum"] if name in held else "missing"
                        stale.append(f"{name} on worker {worker} (sent {value}, server {reported})")
            if stale:
                raise WeightSyncError(
                    f"After the weight update the vLLM server at {self.base_url} holds other values than the trainer "
                    f"sent for {len(stale)} of {len(sent)} checked parameters: the transfer did not land, and "
                    f"generation would use stale weights. First: {stale[0]}"
                )

        def _server_checksums(self, names: list[str] | None) -> list[dict[str, Any]]:
            response = self._post(f"{self.base_url}/collective_rpc",
                                  json={"method": CHECKSUM_METHOD, "args": [json.dumps(names)]})
            return response["results"]

        @staticmethod
        def _common_parameters(per_worker: list[dict[str, Any]]) -> dict[str, tuple[str, list[int]]]:
            """``name -> (dtype, shape)`` of the parameters every worker holds alike."""
            common = None
            for held in per_worker:
                found = {name: (entry["dtype"], entry["shape"]) for name, entry in held.items()}
                common = found if common is None else {n: v for n, v in common.items() if found.get(n) == v}
            return common or {}

        def close_communicator(self) -> None:
            self.communicator = None

    return GlooVLLMClient
