"""The checks a trainer's client runs against a server that loads this package's worker extension, whatever carries
the weights (this package's gloo engine, or vLLM's NCCL one through TRL's client).

`CheckedClientMixin` goes in front of a `BoundedRequestsMixin` client:

- **identity**, on every request that matters: the server's workers are asked for their nonce (drawn when each
  worker process started) before each generation, after it (before its completions are used) and before each sync;
  another answer than at set-up is `WeightSyncError`;
- **held weights**, every ``check_every`` syncs (the first included): when the update finishes, the server reports
  the `sketch` of every parameter as its generation uses it, and `compare_held` compares them with the sketches of
  what was sent, drawn from a seed this client picks for that sync;
- **the server's state** after a failed sync: whether it aborted the sync (``partial`` weights, repaired by the next
  full sync), needs a restart, or does not answer; the error says which.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .bounded import QUICK_TIMEOUT_S, WeightSyncError
from .checksums import same_checksum, sketch

# GlooWeightSyncExtension's methods, called through /collective_rpc.
HELD_WEIGHTS_METHOD = "riskpo_held_weights"
IDENTITY_METHOD = "riskpo_identity"
READINESS_METHOD = "riskpo_readiness"
ABORT_METHOD = "riskpo_abort_update"
# Asking a server for its state after a failed sync waits this long: it may be the server that hangs.
STATE_TIMEOUT_S = 10.0


class CheckedClientMixin:
    """See the module docstring. Needs ``control`` (`BoundedRequestsMixin`) and TRL's ``_updating_weights``."""

    identity: Any = None  # the workers' answers at set-up; None: no checks (no extension on the server)
    server_dtype: str | None = None
    max_model_len: int | None = None
    syncs = 0  # syncs started
    checking = False  # whether the current (or last) sync is checked
    _seed = 0
    _sent: dict[str, tuple[list[int], list[float]]] = {}

    def read_server_config(self) -> dict[str, Any]:
        """The server's resolved vLLM config (``/server_info``); records its dtype and ``max_model_len``."""
        info = self.control("GET", "/server_info", QUICK_TIMEOUT_S, read_only=True, params={"config_format": "json"})[
            "vllm_config"
        ]
        self.server_dtype = str(info["model_config"]["dtype"]).removeprefix("torch.")
        self.max_model_len = info["model_config"].get("max_model_len")
        return info

    def server_identity(self) -> Any:
        """The server's workers' nonces and PIDs (one request)."""
        return self.control(
            "POST", "/collective_rpc", self.quick_timeout_s, read_only=True, json={"method": IDENTITY_METHOD}
        )["results"]

    def check_identity(self, before: str) -> None:
        """`WeightSyncError` unless the server's workers are the processes the sync was set up with."""
        if self.identity is None:
            return
        try:
            current = self.server_identity()
        except WeightSyncError as error:
            raise type(error)(f"Before {before}: {error}") from error
        if current != self.identity:
            raise WeightSyncError(
                f"Before {before}: the vLLM server at {self.base_url} is not the one this trainer synced its "
                f"weights to ({self.identity} at set-up, now {current}): it was restarted or replaced, and "
                "generates with other weights. Nothing it generated was trained on; restart the training, which "
                "resumes from the last checkpoint."
            )

    def generate(self, *args: Any, **kwargs: Any) -> dict[str, list]:
        self.check_identity("generation")
        output = super().generate(*args, **kwargs)
        self.check_identity("training on its completions")
        return output

    def _start_weight_update(self) -> None:
        self.checking = self.identity is not None and self.syncs % self.settings.check_every == 0
        self.syncs += 1
        self._seed, self._sent = random.getrandbits(62), {}
        self.control("POST", "/start_weight_update", json={})

    def _finish_weight_update(self) -> None:
        self.control("POST", "/finish_weight_update", json={})
        sent, self._sent = self._sent, {}
        if self.checking:
            self.verify(sent)

    def recorded(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors to send, each `prepare_for_sending`, with their sketches in the server's dtype when this sync
        is checked."""
        dtype = getattr(torch, self.server_dtype or "float32")
        for name, tensor in named_params:
            tensor = self.prepare_for_sending(tensor)
            if self.checking:
                self._sent[name] = (list(tensor.shape), sketch(tensor.to(dtype), self._seed))
            yield name, tensor

    def prepare_for_sending(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def verify(self, sent: dict[str, tuple[list[int], list[float]]]) -> None:
        held = self.control("POST", "/collective_rpc", json={"method": HELD_WEIGHTS_METHOD, "args": [self._seed]})[
            "results"
        ]
        problems = compare_held(sent, held)
        if problems:
            listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise WeightSyncError(
                f"After the weight update the vLLM server at {self.base_url} does not generate with what the "
                f"trainer sent ({len(problems)} problems): {listed}"
            )

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        """The server's log-prob of each token of ``token_ids`` after the first (temperature 1)."""
        served = self.get_sequence_logprobs([token_ids], [1], top_logprobs=1)["actual_logprobs"][0]
        return [position[0] for position in served]

    def server_state(self, timeout: float = STATE_TIMEOUT_S) -> list[dict[str, Any]]:
        """Each worker's `riskpo_readiness` (weights, failure, owner)."""
        return self.control("POST", "/collective_rpc", timeout, read_only=True, json={"method": READINESS_METHOD})[
            "results"
        ]

    def with_server_state(self, error: WeightSyncError) -> WeightSyncError:
        """``error`` (same class), with what the server says of its weights after the failed sync: whether it needs
        a restart."""
        try:
            states = {state["weights"] for state in self.server_state()}
        except WeightSyncError as unanswered:
            advice = (
                f"The server does not answer now either ({unanswered}): restart it unless it recovers; a server "
                "that recovers aborts the broken sync itself, and the next full sync repairs its weights."
            )
        else:
            if "broken" in states:
                advice = "The server could not restore its weights after the broken sync: restart it."
            elif "unknown" in states:
                advice = (
                    "The server's weight-transfer engine does not report its state (vLLM's NCCL engine): restart "
                    "the server if the resumed run's first sync fails."
                )
            elif states & {"partial", "updating"}:
                advice = (
                    "The server aborted the sync: its weights are a mix of old and new until the next full sync, "
                    "which the resumed run sends before it generates; no restart needed."
                )
            else:
                advice = f"The server reports its weights as {', '.join(sorted(states))}; no restart needed."
        return type(error)(f"{str(error).rstrip('. ')}. {advice}")


def drain(named_params: Iterator[Any]) -> None:
    """Walk the rest of a sync's parameters after it failed: under ZeRO-3 each one is gathered by every process, so
    the others, which walk them all, are not left waiting in a gather the main process never joins."""
    for _ in named_params:
        pass


def compare_held(sent: dict[str, tuple[list[int], list[float]]], per_worker: list[list[dict[str, Any]]]) -> list[str]:
    """What differs between the tensors sent (name -> shape, `sketch`) and each worker's `held_weights` report:
    a parameter held as other values, in another shape, unreadable, or under a name nothing was sent for, and a sent
    name no worker holds. Empty when the server generates with exactly what was sent."""
    problems = []
    for worker, entries in enumerate(per_worker):
        covered = set()
        for entry in entries:
            name, where = entry["name"], f"{entry['held_as']} on worker {worker}"
            if name not in sent:
                problems.append(f"{where} (as {name}): no tensor of that name was sent, so no sync updates it")
                continue
            covered.add(name)
            shape, value = sent[name]
            if entry["checksum"] is None:
                problems.append(f"{where} (as {name}): empty, and cannot be read back")
            elif entry["shape"] != shape:
                problems.append(f"{where} (as {name}): shape {entry['shape']}, sent {shape}")
            elif not same_checksum(value, entry["checksum"]):
                problems.append(f"{where} (as {name}): checksum {entry['checksum']}, sent {value}")
        problems.extend(
            f"{name}: worker {worker} holds nothing under this name" for name in sent if name not in covered
        )
    return problems
