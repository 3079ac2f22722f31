"""The server side, imported by `vllm serve` in each worker through ``--worker-extension-cls``.

Importing this module registers `GlooWeightTransferEngine` with vLLM's weight-transfer factory under ``BACKEND``
(before the worker loads its model and builds its engine). The engine receives checkpoint-format tensors
(the trainer's parameter names) one by one over the gloo group and loads them with vLLM's layer-wise reload, as vLLM's
NCCL engine does; what differs is the transport, no CUDA call, and one repair when the update finishes:

On CPU, vLLM's LM head does not multiply with its weight but with a packed copy made when the model loaded
(``dispatch_cpu_unquantized_gemm`` with ``remove_weight=False``). When the head is tied to the embedding, a reload
updates the shared weight through the embedding and never packs the head again, so generation would go on with the
initial head. `repack_tied_cpu_layers` packs such layers again.

The worker extension answers the trainer's checks through ``/collective_rpc``: the worker's identity (a nonce drawn
when the worker process started) and `held_weights`, the checksum of every parameter as generation uses it, under the
trainer's names.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from .. import compat

compat.check_vllm_weight_transfer()  # one clear error in the server's log on a vLLM without the API used here

from vllm.distributed.weight_transfer.base import (  # noqa: E402
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: E402
from vllm.model_executor.layers.linear import LinearBase  # noqa: E402
from vllm.model_executor.layers.vocab_parallel_embedding import (  # noqa: E402
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.reload import (  # noqa: E402
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

from . import BACKEND  # noqa: E402
from .checksums import checksum  # noqa: E402
from .gloo import DEFAULT_TIMEOUT_S, broadcast_from_trainer, open_group  # noqa: E402

# Drawn once per worker process: a restarted or replaced server answers with another one.
WORKER_NONCE = uuid.uuid4().hex
# Rows of the identity matrix multiplied through a packed layer at a time (memory: this many rows of its output).
_UNPACK_ROWS = 1024


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = DEFAULT_TIMEOUT_S  # joining the group
    transfer_timeout_s: float = DEFAULT_TIMEOUT_S  # each tensor's broadcast


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM weight-transfer engine over a gloo group, for CPU servers."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = None
        self.transfer_timeout_s = DEFAULT_TIMEOUT_S

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        replica = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
        rank = init_info.rank_offset + replica * parallel.world_size + parallel.rank
        self.group = open_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s
        )
        self.transfer_timeout_s = init_info.transfer_timeout_s

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class then synchronizes the accelerator, which a CPU worker does not have.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("The gloo weight transfer is not initialized: call init_weight_transfer_engine first.")
        for name, dtype_name, shape in zip(
            update_info.names, update_info.dtype_names, update_info.shapes, strict=True
        ):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            broadcast_from_trainer(self.group, tensor, self.transfer_timeout_s)
            self.model.load_weights([(name, tensor)])  # the reload may keep it until its layer is complete

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        repack_tied_cpu_layers(self.model)

    def shutdown(self) -> None:
        self.group = None


def repack_tied_cpu_layers(model: torch.nn.Module) -> list[str]:
    """Pack again, from their current weight, the CPU GEMM layers whose weight another module shares (a tied LM head
    and its embedding); returns their names. Other layers are packed by the reload itself."""
    owners: dict[int, list[str]] = {}
    for module_name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(module_name)
    repacked = []
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if (
            not hasattr(module, "cpu_linear")
            or not isinstance(weight, torch.Tensor)
            or weight.numel() == 0
            or len(owners.get(id(weight), ())) < 2
            or method is None
        ):
            continue
        method.process_weights_after_loading(module)
        repacked.append(module_name)
    return repacked


def held_weights(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Every parameter of ``model`` as generation uses it, cut back to the trainer's tensors: one entry per (server
    parameter, trainer name) with the trainer's ``name``, the server's ``held_as``, dtype, shape and `checksum`.

    - A linear layer or LM head is read through its own matmul (``quant_method.apply``) on the identity matrix, so a
      weight that vLLM packed for oneDNN and dropped, or a stale packed copy next to a fresh weight, is read as used.
    - A fused layer (``packed_modules_mapping``: ``qkv_proj`` from ``q_proj``, ``k_proj``, ``v_proj``) is cut back into
      its parts by ``output_sizes``; an embedding or LM head loses the rows vLLM pads its vocabulary with.
    - A parameter shared by several modules (a tied LM head) carries the name of the module that loads it.
    - An empty parameter that none of these reads gets ``checksum`` None: the trainer cannot verify it.
    """
    loaded_as: dict[int, str] = {}
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(prefix=module_name, recurse=False):
            loaded_as.setdefault(id(parameter), name)
    packed = getattr(model, "packed_modules_mapping", None) or {}
    entries = []
    for module_name, module in model.named_modules():
        for local_name, parameter in module.named_parameters(recurse=False):
            held_as = f"{module_name}.{local_name}" if module_name else local_name
            tensor = _as_used(module, local_name, parameter)
            owner, _, leaf = loaded_as[id(parameter)].rpartition(".")
            parent, _, layer = owner.rpartition(".")
            parts = packed.get(layer)
            if parts and tensor is not None and len(parts) == len(getattr(module, "output_sizes", ())):
                prefix = f"{parent}." if parent else ""
                pieces = zip(
                    (f"{prefix}{part}.{leaf}" for part in parts),
                    tensor.split(list(module.output_sizes), dim=0),
                    strict=True,
                )
            else:
                pieces = [(loaded_as[id(parameter)], tensor)]
            for name, piece in pieces:
                entries.append(
                    {
                        "name": name,
                        "held_as": held_as,
                        "dtype": str(parameter.dtype).removeprefix("torch."),
                        "shape": None if piece is None else list(piece.shape),
                        "checksum": None if piece is None else checksum(piece),
                    }
                )
    return entries


def _as_used(module: torch.nn.Module, local_name: str, parameter: torch.Tensor) -> torch.Tensor | None:
    """The tensor generation computes with for ``module``'s parameter ``local_name`` (see `held_weights`)."""
    if local_name == "weight" and isinstance(module, LinearBase | ParallelLMHead):
        weight = _through_matmul(module, parameter.dtype)
    else:
        weight = parameter.detach()
    if weight is not None and local_name == "weight" and isinstance(module, VocabParallelEmbedding):
        weight = weight[: module.org_vocab_size]
    return None if weight is None or weight.numel() == 0 else weight


def _through_matmul(module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """``[out, in]``: the layer's matmul applied to the identity, without bias (exact: each output is one product by
    1 plus products by 0)."""
    inputs = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim", None)
    method = getattr(module, "quant_method", None)
    if not inputs or method is None:
        return None
    with torch.no_grad():
        blocks = []
        for start in range(0, inputs, _UNPACK_ROWS):
            rows = min(_UNPACK_ROWS, inputs - start)
            identity = torch.zeros(rows, inputs, dtype=dtype)
            identity[torch.arange(rows), torch.arange(start, start + rows)] = 1
            blocks.append(method.apply(module, identity, None))
    return torch.cat(blocks).T


class GlooWeightSyncExtension:
    """Worker extension (``--worker-extension-cls``): importing it registers the engine; its methods answer the
    trainer's checks, through vLLM's ``/collective_rpc``."""

    def riskpo_identity(self) -> dict[str, Any]:
        """This worker process's nonce and PID: another answer means another server process."""
        return {"nonce": WORKER_NONCE, "pid": os.getpid()}

    def riskpo_held_weights(self) -> list[dict[str, Any]]:
        """`held_weights` of this worker's model."""
        return held_weights(self.get_model())


try:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
except ValueError:  # imported again in the same process
    pass
