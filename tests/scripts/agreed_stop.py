"""Run by tests/test_weight_sync_agreement.py under `accelerate launch` (2 CPU processes): TRL's own server-mode
``VLLMGeneration.generate`` and a sync, wrapped by `check_weight_syncs`, with a main process whose server fails as
argv[2] says; each process writes what it raised, and when, to argv[1]/rank<i>.json.

- ``generation-timeout``: the server does not answer a generation within its 2 s timeout;
- ``sync-error``: a sync fails (a check that does not hold);
- ``signal``: the server never answers (timeout 120 s) and the main process gets SIGTERM after 1 s.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch.distributed
from accelerate import PartialState
from trl.generation.vllm_generation import VLLMGeneration

from riskpo_trl.job.preemption import StopOnSignal
from riskpo_trl.weight_sync.bounded import (
    BoundedRequestsMixin,
    ServerTimeoutError,
    WeightSyncError,
    interruptible_wait,
)
from riskpo_trl.weight_sync.probe import check_weight_syncs


class HungServer:
    """TRL's client as the wrappers see it, in front of a server that never answers: ``generate`` waits (as a
    request does) until its timeout."""

    base_url = "http://stand-in:8000"

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s

    def generate(self, prompts, **kwargs):
        with interruptible_wait():
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                time.sleep(0.01)
        raise ServerTimeoutError(
            f"The vLLM server at {self.base_url} did not answer /v1/completions (generation) within "
            f"{self.timeout_s:g} s: Read timed out."
        )


class Client(BoundedRequestsMixin, HungServer):
    def __init__(self, timeout_s: float):
        HungServer.__init__(self, timeout_s)


def main(out_dir: Path, fault: str) -> None:
    state = PartialState(cpu=True)
    client = Client(120.0 if fault == "signal" else 2.0) if state.is_main_process else None
    synced = []

    def sync_weights():
        synced.append(state.process_index)
        if fault == "sync-error" and state.is_main_process:
            raise WeightSyncError(f"After the weight update the vLLM server at {client.base_url} differs.")

    generation = SimpleNamespace(
        mode="server",
        accelerator=state,
        vllm_client=client,
        model=SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=64))),
        sync_weights=sync_weights,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        max_completion_length=4,
        logprobs=0,
        structured_outputs_regex=None,
        generation_kwargs={},
        enable_sleep_mode=False,
    )
    generation.generate = VLLMGeneration.generate.__get__(generation)  # TRL's own, with its collectives
    trainer = SimpleNamespace(
        vllm_generation=generation, accelerator=state, state=SimpleNamespace(global_step=3), args=SimpleNamespace()
    )
    check_weight_syncs(trainer)
    stop = StopOnSignal(1)
    stop.install()
    if fault == "signal" and state.is_main_process:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    outcome = {"raised": None}
    try:
        generation.sync_weights()
        generation.generate([[1, 2, 3]], None, 1)
    except BaseException as error:  # what each process raised is the result
        outcome = {"raised": type(error).__name__, "message": str(error)}
    outcome.update(seconds=time.monotonic() - started, synced=synced, requested=stop.requested)
    stop.restore()
    (out_dir / f"rank{state.process_index}.json").write_text(json.dumps(outcome))
    # As the training script ends (accelerator.end_training): the group is torn down before the interpreter exits,
    # not by its own destructor at exit, where gloo once aborted a process whose peer was exiting too.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
