"""Weight sync of vLLM server mode without CUDA: the trained weights travel to `vllm serve` over a gloo group.

TRL's server mode pushes weights with vLLM's NCCL weight-transfer engine, which needs CUDA on both sides. This package
adds a second engine for CPU servers, registered with vLLM under the backend name ``BACKEND``:

- ``server``: the engine and the worker extension that loads it into `vllm serve` (``--worker-extension-cls``); after
  each update it re-packs the CPU LM head that a tied embedding shares, which vLLM's reload leaves stale;
- ``client``: TRL's `VLLMClient` with the gloo transport, used by the trainers when the server reports ``BACKEND``,
  which checks after every update that the server holds what was sent;
- ``checksums``: the checksums both sides compute for that check;
- ``gate``: the API process's middleware that answers generation requests during a sync with 503 and aborts a sync
  its trainer left unfinished.

A server started with ``SERVER_ARGS`` (the launcher's ``--vllm-args``) speaks it; on any other backend the trainers
use TRL's client unchanged (docs/scale_out.md).
"""

from __future__ import annotations

BACKEND = "riskpo_gloo"
WORKER_EXTENSION = "riskpo_trl.weight_sync.server.GlooWeightSyncExtension"
# The API process's middleware that refuses generation while a sync replaces the weights (weight_sync.gate).
SYNC_GATE = "riskpo_trl.weight_sync.gate.SyncGate"
# The extra `trl vllm-serve` arguments of a CPU server: float32, this engine, the extension that registers it, and the
# gate.
SERVER_ARGS = (
    "--dtype",
    "float32",
    "--weight-transfer-config.backend",
    BACKEND,
    "--worker-extension-cls",
    WORKER_EXTENSION,
    "--middleware",
    SYNC_GATE,
)
