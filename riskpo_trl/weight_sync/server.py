"""The server side, imported by `vllm serve` in each worker through ``--worker-extension-cls``.

Importing this module registers `GlooWeightTransferEngine` with vLLM's weight-transfer factory under ``BACKEND``
(before the worker loads its model and builds its engine). The engine receives checkpoint-format tensors
(the trainer's parameter names) one by one over the gloo group and loads them with vLLM's layer-wise reload, as vLLM's
NCCL engine does; what differs is the transport, no CUDA call, and one repair when the update finishes:

On CPU, vLLM's LM head does not multiply with its weight but with a packed copy made when the model loaded
(``dispatch_cpu_unquantized_gemm`` with ``remove_weight=False``). When the head is tied to the embedding, a reload
updates the shared weight through the embedding and never packs the head again, so generation would go on with the
initial head. `repack_tied_cpu_layers` packs such layers again.
"""

from __future__ import annotations

import json
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
from vllm.model_executor.model_loader.reload import (  # noqa: E402
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

from . import BACKEND  # noqa: E402
from .checksums import checksum  # noqa: E402
from .gloo import broadcast_from_trainer, open_group  # noqa: E402


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM weight-transfer engine over a gloo group, for CPU servers."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        replica = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
        rank = init_info.rank_offset + replica * parallel.world_size + parallel.rank
        self.group = open_group(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                init_info.timeout_s)

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class then synchronizes the accelerator, which a CPU worker does not have.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("The gloo weight transfer is not initialized: call init_weight_transfer_engine first.")
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes,
                                           strict=True):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            broadcast_from_trainer(self.group, tensor)
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
        if (not hasattr(module, "cpu_linear") or not isinstance(weight, torch.Tensor) or weight.numel() == 0
                or len(owners.get(id(weight), ())) < 2 or method is None):
            continue
        method.process_weights_after_loading(module)
        repacked.append(module_name)
    return repacked


class GlooWeightSyncExtension:
    """Worker extension (``--worker-extension-cls``): importing it registers the engine; its method answers the
    trainer's check after each update, through vLLM's ``/collective_rpc``."""

    def riskpo_weight_checksums(self, names_json: str) -> dict[str, Any]:
        """`checksum` of each named parameter the model holds under that name (names as JSON, or "null" for all),
        with its dtype and shape; parameters vLLM has packed away (empty) are left out."""
        names = json.loads(names_json)
        held = {}
        for name, parameter in self.get_model().named_parameters():
            if parameter.numel() == 0 or (names is not None and name not in names):
                continue
            held[name] = {"dtype": str(parameter.dtype).removeprefix("torch."), "shape": list(parameter.shape),
                          "checksum": checksum(parameter)}
        return held


try:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
except ValueError:  # imported again in the same process
    pass
