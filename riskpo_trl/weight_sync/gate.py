"""`SyncGate`: the vLLM server's API process refuses generation while its weights are being replaced.

Between ``/start_weight_update`` and ``/finish_weight_update`` a server's layers sit on the meta device (vLLM's
layer-wise reload): a generation request then crashes the engine (``EngineDeadError``). `SyncGate`, an ASGI middleware
loaded with ``vllm serve --middleware riskpo_trl.weight_sync.gate.SyncGate`` (part of ``SERVER_ARGS``), answers any
generation request during a sync with ``503`` and a one-line reason, without passing it on; the trainer's own sync
requests, ``/collective_rpc``, ``/health`` and every ``GET`` pass. ``/start_weight_update`` waits until the generation
requests already passed on have been answered (at most the transfer timeout below), so none runs on the reloading
model.

A sync nobody finishes (its trainer died after ``/start_weight_update``) is aborted by the gate itself: when no sync
request has been in flight for the trainer's transfer timeout (``transfer_timeout_s`` of its
``/init_weight_transfer_engine``, ``DEFAULT_ABANDONED_S`` before any), the next request that arrives (a generation,
a readiness query) first asks the workers to abort it (``riskpo_abort_update``: each layer new or previous, readiness
``partial``), then passes. One gate per API process: a server with ``--api-server-count`` above 1 is not covered.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from .checked import ABORT_METHOD

# Requests that generate (or run the model) and must wait for the end of a sync.
GENERATING_PREFIXES = (
    "/v1/",
    "/generate",
    "/inference/",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/invocations",
)
# The trainer's requests of a sync: the gate's clock of a live sync runs while one is in flight.
SYNC_PATHS = ("/start_weight_update", "/update_weights", "/finish_weight_update", "/collective_rpc")
DEFAULT_ABANDONED_S = 120.0  # the trainer's default vllm_sync_timeout
RETRY_AFTER_S = 1


class SyncGate:
    """See the module docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.updating = False
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self.abandoned_s = DEFAULT_ABANDONED_S
        self.generating = 0  # generation requests passed on and not answered yet

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if self.updating and not self.in_flight and time.monotonic() - self.last_activity > self.abandoned_s:
            await self.abort_abandoned(scope)
        if method == "POST" and path in SYNC_PATHS:
            await self.sync_request(path, scope, receive, send)
        elif method == "POST" and path == "/init_weight_transfer_engine":
            await self.app(scope, await self.reading_timeout(receive), send)
        elif method == "POST" and path.startswith(GENERATING_PREFIXES):
            if self.updating:
                await refuse(send, path)
                return
            self.generating += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.generating -= 1
        else:
            await self.app(scope, receive, send)

    async def sync_request(self, path: str, scope: dict, receive: Any, send: Any) -> None:
        if path == "/start_weight_update":
            self.updating = True  # before the workers start: a generation arriving meanwhile is refused
            await self.generations_answered()
        status = []

        async def recorded_send(message: dict) -> None:
            if message.get("type") == "http.response.start":
                status.append(message.get("status"))
            await send(message)

        self.in_flight += 1
        try:
            await self.app(scope, receive, recorded_send)
        finally:
            self.in_flight -= 1
            self.last_activity = time.monotonic()
            if path == "/finish_weight_update" or (path == "/start_weight_update" and status != [200]):
                self.updating = False  # finished; or a start that failed (no sync began)
        if self.updating and (path == "/collective_rpc" or status != [200]):
            # An abort (riskpo_abort_update, or the engine's own after a broken transfer) ends the sync.
            self.updating = await self.workers_updating(scope)

    async def generations_answered(self) -> None:
        """Until the generation requests passed on before the sync have been answered (they would run on the
        reloading model), at most the trainer's transfer timeout; then the sync starts anyway."""
        deadline = time.monotonic() + self.abandoned_s
        while self.generating and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def reading_timeout(self, receive: Any) -> Any:
        """``receive``, recording the trainer's transfer timeout from the request's body on its way."""
        chunks: list[bytes] = []

        async def reading() -> dict:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                try:
                    info = json.loads(b"".join(chunks) or b"{}").get("init_info", {})
                    self.abandoned_s = float(info.get("transfer_timeout_s", DEFAULT_ABANDONED_S))
                except (ValueError, TypeError, AttributeError):
                    pass
            return message

        return reading

    async def workers_updating(self, scope: dict) -> bool:
        """Whether any worker still reports a sync under way (a failed question keeps the gate as it is)."""
        try:
            results = await engine_client(scope).collective_rpc("riskpo_readiness")
            return any(result.get("weights") == "updating" for result in results)
        except Exception:  # noqa: BLE001 -- a worker without the extension, a busy engine: keep the gate's state
            return self.updating

    async def abort_abandoned(self, scope: dict) -> None:
        """Abort the sync its trainer left (see the module docstring)."""
        try:
            await engine_client(scope).collective_rpc(ABORT_METHOD)
        except Exception:  # noqa: BLE001 -- the refusals go on; the next trainer's set-up aborts it too
            self.last_activity = time.monotonic()
            return
        self.updating = False


def engine_client(scope: dict) -> Any:
    """vLLM's engine client, as its own routes find it (``app.state.engine_client``)."""
    return scope["app"].state.engine_client


async def refuse(send: Any, path: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": f"{path} refused: this server's weights are being replaced by its trainer's weight sync "
                "(riskpo_trl). Retry after the sync; its readiness (POST /collective_rpc riskpo_readiness) says "
                "'updating' meanwhile.",
                "type": "ServiceUnavailable",
                "code": 503,
            }
        }
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
