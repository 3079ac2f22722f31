"""Faults injected into a real `vllm serve` by the real-vLLM tests (loaded as its ``--worker-extension-cls``, from
this directory): the engine's re-pack of a tied LM head, turned off and on again through ``/collective_rpc``."""

from __future__ import annotations

from riskpo_trl.weight_sync import server

REPACK_TIED_CPU_LAYERS = server.repack_tied_cpu_layers


class FaultInjectionExtension(server.GlooWeightSyncExtension):
    def riskpo_test_skip_tied_repack(self, skip: str) -> None:
        """``"true"``: updates finish without packing a tied LM head again; anything else restores the re-pack."""
        server.repack_tied_cpu_layers = (lambda model: []) if skip == "true" else REPACK_TIED_CPU_LAYERS
