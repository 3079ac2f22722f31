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

A sync that breaks off (the trainer died, a transfer timed out) is aborted on the server: vLLM's reload is finalized,
so each layer holds either its new weights or its previous ones and none is left on the meta device, and the engine
reports its weights as ``partial`` until the next full sync. The engine also records which trainer owns it (the
address and port of its weight-sync group), so that a second trainer can be refused while the first is alive.
`GlooWeightSyncExtension.riskpo_readiness` reports both.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from ..compat import serving

serving.check_vllm_weight_transfer()  # one clear error in the server's log on a vLLM without the API used here

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
from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info  # noqa: E402

from . import BACKEND  # noqa: E402
from .bounded import error_text  # noqa: E402
from .checksums import checksum, sketch_columns  # noqa: E402
from .gloo import DEFAULT_TIMEOUT_S, broadcast_from_trainer, open_group  # noqa: E402

# Drawn once per worker process: a restarted or replaced server answers with another one.
WORKER_NONCE = uuid.uuid4().hex
# What `GlooWeightTransferEngine.weights` can be: the model as loaded, a sync under way, the last sync complete, a sync
# that broke off (each layer new or previous: a mix until the next full sync), or a model the abort could not restore.
WEIGHT_STATES = ("initial", "updating", "synced", "partial", "broken")


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = DEFAULT_TIMEOUT_S  # joining the group
    transfer_timeout_s: float = DEFAULT_TIMEOUT_S  # each tensor's broadcast
    trainer: str = ""  # the trainer's host name and process id, for the messages of a refused second trainer
    packed: bool = False  # what TRL's client adds for vLLM's NCCL engine; ignored


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool = False  # what TRL's client adds for vLLM's NCCL engine; ignored

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
        self.weights = "initial"  # one of WEIGHT_STATES
        self.failure = ""  # why the last sync broke off
        self.owner: dict[str, Any] | None = None  # the trainer whose group this engine joined

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        replica = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
        rank = init_info.rank_offset + replica * parallel.world_size + parallel.rank
        self.group = open_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s
        )
        self.transfer_timeout_s = init_info.transfer_timeout_s
        self.owner = {
            "address": init_info.master_address,
            "port": init_info.master_port,
            "trainer": init_info.trainer,
        }

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)
        self.weights = "updating"

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class then synchronizes the accelerator, which a CPU worker does not have.
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException as error:
            self.abort(f"the transfer broke off: {error_text(error)}")
            raise

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
        self.weights, self.failure = "synced", ""

    def abort(self, reason: str) -> None:
        """End a sync that broke off: vLLM's reload puts back the previous tensors of every layer it did not
        complete, so generation finds no parameter on the meta device; the weights are ``partial`` until the next
        full sync, or ``broken`` when that fails too."""
        self.failure = reason
        try:
            forget_incomplete_layers(self.model)
            finalize_layerwise_reload(self.model, self.model_config)
            repack_tied_cpu_layers(self.model)
        except Exception as error:
            self.weights, self.failure = "broken", f"{reason}; restoring the previous weights failed too: {error}"
        else:
            self.weights = "partial"

    def readiness(self) -> dict[str, Any]:
        """The weights' state, why the last sync broke off, the owner, and whether generation may run now
        (``serves``: not during a sync, whose layers sit on the meta device, and not on weights the abort could not
        restore)."""
        serves = self.weights not in ("updating", "broken")
        return {"weights": self.weights, "failure": self.failure, "owner": self.owner, "serves": serves}

    def shutdown(self) -> None:
        self.group = None


def forget_incomplete_layers(model: torch.nn.Module) -> None:
    """Drop the tensors buffered for layers whose reload did not complete, so that finalizing the reload puts back
    their previous tensors instead of building a layer from only some of its new weights."""
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if info.can_load() and info.kernel_tensors is not None:
            info.loaded_weights.clear()
            info.load_numel = 0


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


def held_weights(model: torch.nn.Module, seed: int) -> list[dict[str, Any]]:
    """Every parameter of ``model`` as generation uses it, cut back to the trainer's tensors: one entry per (server
    parameter, trainer name) with the trainer's ``name``, the server's ``held_as``, dtype, shape, and ``checksum``:
    the `sketch` of the tensor for ``seed`` (checksums module).

    - A linear layer or LM head is read through its own matmul (``quant_method.apply``) on the one-hot rows of the
      sketch's columns, so a weight that vLLM packed for oneDNN and dropped, or a stale packed copy next to a fresh
      weight, is read as used.
    - A fused layer (``packed_modules_mapping``: ``qkv_proj`` from ``q_proj``, ``k_proj``, ``v_proj``) is cut back into
      its parts by ``output_sizes``; an embedding or LM head loses the rows vLLM pads its vocabulary with.
    - A parameter shared by several modules (a tied LM head) carries the name of the module that loads it.
    - An empty parameter that none of these reads gets ``checksum`` None: the trainer cannot verify it.
    """
    loaded_as: dict[int, str] = {}
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(prefix=module_name, recurse=False):
            loaded_as.setdefault(id(parameter), name)
    entries = []
    for module_name, module in model.named_modules():
        for local_name, parameter in module.named_parameters(recurse=False):
            held_as = f"{module_name}.{local_name}" if module_name else local_name
            read, shape = _as_used(module, local_name, parameter, seed)
            for name, piece, piece_shape in _trainer_pieces(model, module, loaded_as[id(parameter)], read, shape):
                entries.append(
                    {
                        "name": name,
                        "held_as": held_as,
                        "dtype": str(parameter.dtype).removeprefix("torch."),
                        "shape": piece_shape,
                        "checksum": None if piece is None else checksum(piece),
                    }
                )
    return entries


def _trainer_pieces(
    model: torch.nn.Module, module: torch.nn.Module, loaded_as: str, read: torch.Tensor | None, shape: list[int]
) -> list[tuple[str, torch.Tensor | None, list[int] | None]]:
    """``(trainer name, part of read, its full shape)`` of a parameter loaded as ``loaded_as``: one per part of a
    fused layer, else one."""
    owner, _, leaf = loaded_as.rpartition(".")
    parent, _, layer = owner.rpartition(".")
    parts = (getattr(model, "packed_modules_mapping", None) or {}).get(layer)
    sizes = list(getattr(module, "output_sizes", ()))
    if read is None:
        return [(loaded_as, None, None)]
    if not parts or len(parts) != len(sizes):
        return [(loaded_as, read, shape)]
    prefix = f"{parent}." if parent else ""
    return [
        (f"{prefix}{part}.{leaf}", piece, [size, *shape[1:]])
        for part, piece, size in zip(parts, read.split(sizes, dim=0), sizes, strict=True)
    ]


def _as_used(
    module: torch.nn.Module, local_name: str, parameter: torch.Tensor, seed: int
) -> tuple[torch.Tensor | None, list[int]]:
    """What generation computes with for ``module``'s parameter ``local_name``, read for the sketch of ``seed``:
    ``(the sketch's columns of a matrix or the whole tensor, the full shape)``; ``(None, [])`` when unreadable."""
    if local_name == "weight" and isinstance(module, LinearBase | ParallelLMHead):
        return _through_matmul(module, parameter.dtype, seed)
    weight = parameter.detach()
    if local_name == "weight" and isinstance(module, VocabParallelEmbedding):
        weight = weight[: module.org_vocab_size]
    if weight.numel() == 0:
        return None, []
    if weight.dim() != 2:
        return weight, list(weight.shape)
    columns = torch.tensor(sketch_columns(seed, weight.shape[1]), device=weight.device)
    return weight.index_select(1, columns), list(weight.shape)


def _through_matmul(module: torch.nn.Module, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor | None, list[int]]:
    """``[out, k]``: the sketch's ``k`` columns of the layer's ``[out, in]`` weight, as its matmul applied to their
    one-hot rows gives them, without bias (exact: each output is one product by 1 plus products by 0)."""
    inputs = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim", None)
    method = getattr(module, "quant_method", None)
    if not inputs or method is None:
        return None, []
    columns = sketch_columns(seed, inputs)
    one_hot = torch.zeros(len(columns), inputs, dtype=dtype)
    one_hot[torch.arange(len(columns)), torch.tensor(columns)] = 1
    with torch.no_grad():
        read = method.apply(module, one_hot, None).T
    if isinstance(module, VocabParallelEmbedding):  # an LM head: vLLM pads its vocabulary
        read = read[: module.org_vocab_size]
    if read.numel() == 0:
        return None, []
    return read, [read.shape[0], inputs]


class GlooWeightSyncExtension:
    """Worker extension (``--worker-extension-cls``): importing it registers the engine; its methods answer the
    trainer's checks, through vLLM's ``/collective_rpc``. They read the model, not the transport, so they answer on
    any weight-transfer engine (TRL's NCCL one included); the readiness is this package's engine's alone."""

    def riskpo_identity(self) -> dict[str, Any]:
        """This worker process's nonce and PID: another answer means another server process."""
        return {"nonce": WORKER_NONCE, "pid": os.getpid()}

    def riskpo_held_weights(self, seed: int = 0) -> list[dict[str, Any]]:
        """`held_weights` of this worker's model, for the sketch of ``seed``."""
        return held_weights(self.get_model(), int(seed))

    def riskpo_readiness(self) -> dict[str, Any]:
        """The state of this worker's weights (`WEIGHT_STATES`), why the last sync broke off, and the trainer that
        owns the weight sync; ``weights`` is ``"unknown"`` on another engine than this package's."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, GlooWeightTransferEngine):
            return {"weights": "unknown", "failure": "", "owner": None, "serves": None}
        return engine.readiness()

    def riskpo_abort_update(self) -> dict[str, Any]:
        """End a sync its trainer left unfinished (started, never finished), as `GlooWeightTransferEngine.abort`
        does; then `riskpo_readiness`."""
        engine = getattr(self, "weight_transfer_engine", None)
        if isinstance(engine, GlooWeightTransferEngine) and getattr(self, "_weight_update_active", False):
            engine.abort("its trainer left it unfinished")
            engine.reset_weight_update_target()
            self._weight_update_active = False
        return self.riskpo_readiness()


try:
    WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
except ValueError:  # imported again in the same process
    pass
