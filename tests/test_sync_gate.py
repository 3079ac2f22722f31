"""The vLLM API process's gate (riskpo_trl.weight_sync.gate), as plain ASGI: generation during a sync is refused with
503, the trainer's own requests pass, and a sync whose trainer went silent is aborted by the gate itself. The app
behind it is a stand-in that records what reached it; the real server is in test_vllm_real_server.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from riskpo_trl.weight_sync import SERVER_ARGS, SYNC_GATE
from riskpo_trl.weight_sync.gate import SyncGate


class Workers:
    """vLLM's engine client as the gate calls it: ``collective_rpc`` of the extension's methods."""

    def __init__(self):
        self.weights, self.calls = "initial", []

    async def collective_rpc(self, method, *args, **kwargs):
        self.calls.append(method)
        if method == "riskpo_abort_update" and self.weights == "updating":
            self.weights = "partial"
        return [{"weights": self.weights}]


class Server:
    """The app behind the gate: answers 200 and records each request's path; the sync's requests move the workers'
    state as vLLM's routes would."""

    def __init__(self):
        self.workers = Workers()
        self.state = SimpleNamespace(engine_client=self.workers)
        self.reached = []

    async def __call__(self, scope, receive, send):
        self.reached.append(scope["path"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/start_weight_update":
            self.workers.weights = "updating"
        elif scope["path"] == "/finish_weight_update":
            self.workers.weights = "synced"
        elif scope["path"] == "/collective_rpc" and json.loads(body or b"{}").get("method") == "riskpo_abort_update":
            await self.workers.collective_rpc("riskpo_abort_update")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def request(gate: SyncGate, server: Server, path: str, body: dict | None = None, method: str = "POST"):
    """``(status, answer)`` of one request through the gate."""
    sent = []
    payload = json.dumps(body or {}).encode()

    async def receive():
        return {"type": "http.request", "body": payload, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "app": server}
    asyncio.run(gate(scope, receive, send))
    status = next(message["status"] for message in sent if message["type"] == "http.response.start")
    answer = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return status, answer.decode()


@pytest.fixture
def gated():
    server = Server()
    return SyncGate(server), server


def test_the_cpu_server_s_arguments_load_the_gate():
    assert SERVER_ARGS[SERVER_ARGS.index("--middleware") + 1] == SYNC_GATE


def test_generation_during_a_sync_is_refused_with_503_and_passes_before_and_after(gated):
    gate, server = gated
    assert request(gate, server, "/v1/completions")[0] == 200
    assert request(gate, server, "/start_weight_update")[0] == 200
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        status, answer = request(gate, server, path)
        assert status == 503 and "weights are being replaced" in answer and "'updating'" in answer
    for path, method in (("/update_weights", "POST"), ("/health", "GET"), ("/v1/models", "GET")):
        assert request(gate, server, path, method=method)[0] == 200  # the sync itself, and what reads no weights
    assert request(gate, server, "/finish_weight_update")[0] == 200
    assert request(gate, server, "/v1/completions")[0] == 200
    assert server.reached.count("/v1/completions") == 2  # the refused ones never reached the engine


def test_an_abort_through_the_extension_opens_the_gate(gated):
    gate, server = gated
    request(gate, server, "/start_weight_update")
    request(gate, server, "/collective_rpc", {"method": "riskpo_abort_update"})  # the next trainer's set-up
    assert server.workers.weights == "partial"
    assert request(gate, server, "/v1/completions")[0] == 200


def test_a_sync_its_trainer_left_is_aborted_by_the_gate_after_the_trainer_s_transfer_timeout(gated, monkeypatch):
    import riskpo_trl.weight_sync.gate as gate_module

    gate, server = gated
    request(gate, server, "/init_weight_transfer_engine", {"init_info": {"transfer_timeout_s": 5}})
    assert gate.abandoned_s == 5
    now = [1000.0]
    monkeypatch.setattr(gate_module.time, "monotonic", lambda: now[0])
    request(gate, server, "/start_weight_update")
    now[0] += 4
    assert request(gate, server, "/v1/completions")[0] == 503  # within the bound: the trainer may still send
    now[0] += 2
    assert request(gate, server, "/v1/completions")[0] == 200  # the gate aborted the sync first
    assert "riskpo_abort_update" in server.workers.calls and server.workers.weights == "partial"


def test_a_sync_starts_only_once_the_generations_already_passed_on_are_answered():
    """A generation the gate passed on just before the sync must not run on the reloading model: the start waits
    for its answer (the engine would otherwise crash on parameters on the meta device)."""

    async def scenario():
        server, order = Server(), []
        gate = SyncGate(server)
        answering = asyncio.Event()

        async def slow_generation(scope, receive, send):
            order.append("generation starts")
            await answering.wait()
            order.append("generation answered")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        async def app(scope, receive, send):
            if scope["path"] == "/v1/completions":
                await slow_generation(scope, receive, send)
            else:
                order.append(scope["path"])
                await server(scope, receive, send)

        gate.app = app

        async def call(path):
            async def receive():
                return {"type": "http.request", "body": b"{}", "more_body": False}

            async def send(message):
                pass

            await gate({"type": "http", "path": path, "method": "POST", "app": server}, receive, send)

        generation = asyncio.create_task(call("/v1/completions"))
        await asyncio.sleep(0.05)
        start = asyncio.create_task(call("/start_weight_update"))
        await asyncio.sleep(0.1)
        assert order == ["generation starts"]  # the start waits
        answering.set()
        await asyncio.gather(generation, start)
        return order

    assert asyncio.run(scenario()) == ["generation starts", "generation answered", "/start_weight_update"]
