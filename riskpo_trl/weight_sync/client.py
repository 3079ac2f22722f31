"""The trainer side: the hook that gives the trainers their server client.

`serve_weights_to_cpu_servers` wraps a trainer's construction (every trainer of this package: RiskPO and the GRPO/GMPO
baselines). In server mode TRL then opens its client through `open_client`, which reads the server's weight-transfer
backend: for ``BACKEND`` it returns a `GlooVLLMClient` (weight_sync.gloo_client), for any other backend (vLLM's NCCL
engine, on CUDA) a `CheckedVLLMClient` (weight_sync.trl_client): TRL's client and transport, with the same timeouts and
checks. Either gets the job's `SyncSettings` (its timeouts and how often it checks: riskpo-train's ``--vllm_*``
options, or ``riskpo_trl.job.build(..., weight_sync=...)``). Only the TRL 1.16 protocol is supported: with an older
TRL, server mode on a trainer without CUDA is refused at start-up (TRL's own NCCL path on CUDA is unaffected).
`check_weight_syncs` (weight_sync.probe) then adds the log-prob probe after each checked sync.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import torch

from .. import compat
from ..compat import serving
from . import BACKEND, SERVER_ARGS
from .bounded import ServerRefusedError, ServerTimeoutError, SyncSettings, WeightSyncError

__all__ = [
    "ServerRefusedError",
    "ServerTimeoutError",
    "WeightSyncError",
    "open_client",
    "serve_weights_to_cpu_servers",
]


@contextlib.contextmanager
def serve_weights_to_cpu_servers(args: Any, settings: SyncSettings | None = None) -> Iterator[None]:
    """While a trainer is built with ``args``: in vLLM server mode, TRL opens its server client through
    `open_client`, with ``settings`` (default: `SyncSettings`'s). Outside server mode this does nothing."""
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "server"):
        yield
        return
    on_cuda = torch.cuda.is_available() and not getattr(args, "use_cpu", False)
    if not serving.trl_serves_weight_transfer_engines():
        if not on_cuda:
            raise ValueError(
                f"vLLM server mode without CUDA needs TRL 1.16 (installed: trl {compat.installed_version('trl')}): "
                "older TRL releases sync the server's weights over NCCL only. Install trl==1.16.*, or train with "
                "use_vllm=False or vllm_mode='colocate'."
            )
        yield  # TRL's own server protocol and client
        return
    module = serving.trl_vllm_generation_module()
    trl_client_class = module.VLLMClient
    if isinstance(trl_client_class, functools.partial) and trl_client_class.func is open_client:
        yield  # a trainer built inside the training script's hook
        return
    module.VLLMClient = functools.partial(open_client, trl_client_class, on_cuda, settings or SyncSettings())
    try:
        yield
    finally:
        module.VLLMClient = trl_client_class


def open_client(trl_client_class: type, on_cuda: bool, settings: SyncSettings, *args: Any, **kwargs: Any) -> Any:
    """A `GlooVLLMClient` with ``settings`` when the server syncs weights with ``BACKEND``, else TRL's client
    (``trl_client_class``), which reports a server without weight transfer itself; refuses a CUDA-only backend on a
    trainer without CUDA."""
    announce_wait(*args, **kwargs)
    client = trl_client_class(*args, **kwargs)
    backend = served_backend(client)
    if backend == BACKEND:
        client.session.close()
        client = gloo_client_class()(*args, **kwargs)
        client.settings = settings
        return client
    if backend is not None and not on_cuda:
        raise ServerRefusedError(
            f"The vLLM server at {client.base_url} syncs weights with its {backend!r} engine, which needs CUDA, and "
            f"this trainer runs without CUDA. Serve with this package's CPU engine: add --vllm-args "
            f'"{" ".join(SERVER_ARGS)}" to examples/launch/launch_single_node.sh, or these arguments to '
            "`trl vllm-serve` (docs/scale_out.md)."
        )
    if backend is None:
        return client  # TRL's client reports a server without weight transfer when it opens the sync
    client.session.close()
    client = checked_client_class()(*args, **kwargs)
    client.settings = settings
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


def checked_client_class() -> type:
    """`CheckedVLLMClient` (weight_sync.trl_client): TRL's NCCL transport, bounded and checked."""
    from .trl_client import CheckedVLLMClient

    return CheckedVLLMClient


def gloo_client_class() -> type:
    """`GlooVLLMClient` (weight_sync.gloo_client), imported only when a server asks for it."""
    from .gloo_client import GlooVLLMClient

    return GlooVLLMClient
