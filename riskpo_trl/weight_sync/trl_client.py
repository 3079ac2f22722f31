"""`CheckedVLLMClient`: TRL's `VLLMClient` on its own NCCL transport, with its requests bounded in time and, when the
server loads this package's worker extension, the same checks as the gloo path (`CheckedClientMixin`): identity,
held weights every ``check_every`` syncs, the probe, the dtype and context-length refusals. Without the extension
the syncs go unchecked, with one warning naming the argument to add. Imported only for a server that asks for it."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from ..compat import serving
from . import WORKER_EXTENSION
from .bounded import BoundedRequestsMixin, WeightSyncError
from .checked import CheckedClientMixin, drain


class CheckedVLLMClient(CheckedClientMixin, BoundedRequestsMixin, serving.trl_vllm_client_class()):
    """See the module docstring. The transport (``init_communicator``'s group, ``update_named_params``'s broadcast)
    is TRL's, unchanged; the tensors pass through `CheckedClientMixin.recorded` on their way, on their own device."""

    def init_communicator(self, device: Any = 0) -> None:
        self.read_server_config()
        super().init_communicator(device)
        self.identity = self.extension_identity()

    def extension_identity(self) -> Any:
        """The server's identity through the worker extension, or None (with a warning) when it has none."""
        try:
            return self.server_identity()
        except WeightSyncError as error:
            warnings.warn(
                f"The vLLM server at {self.base_url} does not answer this package's checks ({error}), so its weight "
                f"syncs go unchecked. Add --worker-extension-cls {WORKER_EXTENSION} to its arguments "
                "(docs/scale_out.md).",
                stacklevel=2,
            )
            return None

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        named_params = iter(named_params)
        try:
            self.check_identity("the weight sync")
            try:
                super().update_named_params(metadata, self.recorded(named_params))
            except WeightSyncError as error:
                raise self.with_server_state(error) from error
        except BaseException:
            drain(named_params)  # the other processes gather every parameter
            raise
