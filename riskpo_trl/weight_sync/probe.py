"""The trainer's half of the check after each weight sync to a CPU server: the log-prob probe, and the start-up checks
that need the trained model.

`check_weight_syncs` runs once a trainer is built. Where the trainer syncs through a checked client, it refuses a server
whose dtype is not the model's or whose ``max_model_len`` is too short for the data (`context_length`), and wraps the
trainer's ``vllm_generation.sync_weights``: every ``check_every`` syncs, after TRL's sync (whose update the client
then verifies parameter by parameter), the server's log-probs of a fixed token sequence must equal the trained
model's within the dtype's tolerance. Any failure of a sync or a generation is `WeightSyncError` naming the server and
the step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from . import agreement
from .bounded import BoundedRequestsMixin, ServerRefusedError, StopRequested, SyncSettings, WeightSyncError
from .checked import CheckedClientMixin
from .context_length import context_refusal

PROBE_LENGTH = 16
# Largest log-prob gap (nats) between the server and the trained model on the probe that counts as the same weights.
# float32: the same weights gave gaps of about 1e-5 in this project's tests, one optimizer step about 1e-2. The half
# precisions are set wider than their rounding, without a measurement.
PROBE_TOLERANCE = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 2e-1}


def probe_tokens(vocab_size: int) -> list[int]:
    """A fixed sequence of ``PROBE_LENGTH`` ids spread over the vocabulary (the same for every run of one model)."""
    return [(7 + 7919 * i) % vocab_size for i in range(PROBE_LENGTH)]


def model_logprobs(model: torch.nn.Module, token_ids: list[int]) -> list[float]:
    """The model's log-prob of each token of ``token_ids`` after the first, in eval mode, without gradients."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([token_ids], device=next(model.parameters()).device)
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            return logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
    finally:
        model.train(was_training)


def check_probe(client: Any, token_ids: list[int], reference: list[float]) -> None:
    """`WeightSyncError` unless the server's log-probs of ``token_ids`` are within the tolerance of ``reference``."""
    served = client.probe_logprobs(token_ids)
    tolerance = PROBE_TOLERANCE.get(client.server_dtype, PROBE_TOLERANCE["float32"])
    gaps = [abs(a - b) for a, b in zip(served, reference, strict=True)]
    gap = math.nan if any(math.isnan(g) for g in gaps) else max(gaps)
    if not gap <= tolerance:
        raise WeightSyncError(
            f"The vLLM server at {client.base_url} gives the probe sequence other log-probs than the trained model: "
            f"largest gap {gap:.3g} nats, tolerance {tolerance:g} for {client.server_dtype}. Its generation does not "
            "use the weights sent."
        )


def dtype_refusal(client: Any, model: torch.nn.Module) -> str | None:
    """Why a server of another dtype than ``model``'s parameters is refused, or None."""
    trained = str(next(model.parameters()).dtype).removeprefix("torch.")
    if client.server_dtype == trained:
        return None
    return (
        f"The vLLM server at {client.base_url} runs in {client.server_dtype} and the model trains in {trained}: "
        "its log-probs would differ from the trained model's, and the weight sync's check cannot hold. Restart "
        f"it with --dtype {trained} (in --vllm-args of examples/launch/launch_single_node.sh, or after "
        "`trl vllm-serve`)."
    )


def check_weight_syncs(trainer: Any) -> None:
    """See the module docstring. Does nothing unless ``trainer`` generates through a bounded client (this package's:
    a `GlooVLLMClient`, or TRL's NCCL client facing a server with this package's worker extension); every process
    of a multi-process run takes part (the probe's forward pass gathers a sharded model's parameters), and every
    process ends a failed sync or generation together (weight_sync.agreement)."""
    generation = getattr(trainer, "vllm_generation", None)
    if getattr(generation, "mode", None) != "server":
        return
    client = getattr(generation, "vllm_client", None)  # the main process's only
    verdict = [False, None, SyncSettings(), isinstance(client, BoundedRequestsMixin)]
    if isinstance(client, CheckedClientMixin) and client.identity is not None:
        verdict[:3] = [
            True,
            dtype_refusal(client, generation.model) or context_refusal(client, trainer),
            client.settings,
        ]
    processes = trainer.accelerator.num_processes
    if processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(verdict, from_process=0)
    checked, refusal, settings, bounded = verdict
    if refusal:
        raise ServerRefusedError(refusal)
    if not bounded:
        return  # TRL's own client: its requests, its errors
    generation.sync_weights = probed_sync(
        trainer, generation.sync_weights, client, settings.check_every if checked else 0, processes > 1
    )
    generate = client.generate if client is not None else None
    if generate is not None:
        generate = generation_naming_the_step(trainer, client)
    if processes > 1:
        outcome = agreement.GenerationOutcome()
        generation.generate = agreement.trl_generate_agreeing(generation.generate, outcome)
        if generate is not None:
            generate = agreement.generate_agreeing(generate, outcome)
    if generate is not None:
        client.generate = generate


def probed_sync(
    trainer: Any, sync_weights: Callable[[], None], client: Any, check_every: int, agree: bool = False
) -> Callable[[], None]:
    """``sync_weights``, followed every ``check_every`` syncs (0: never) by the probe (as the client's own checks),
    with any failure raised naming the server and the step (the same class: a timeout stays `ServerTimeoutError`).
    ``agree``: a multi-process run, whose processes all raise the main process's failure (`agree_on_sync`)."""
    model = trainer.vllm_generation.model
    token_ids = probe_tokens(model.config.get_text_config().vocab_size)
    syncs = itertools.count()

    def checked_sync_weights() -> None:
        step = trainer.state.global_step
        probed = check_every and next(syncs) % check_every == 0
        failure = None
        try:
            sync_weights()
        except (Exception, StopRequested) as error:
            failure = naming_the_step(error, client, step)
        if probed:
            reference = model_logprobs(model, token_ids)  # every process: a sharded model's forward is collective
            if client is not None and failure is None:
                try:
                    check_probe(client, token_ids, reference)
                except (Exception, StopRequested) as error:
                    failure = naming_the_step(error, client, step)
        if agree:
            agreement.agree_on_sync(failure)
        elif failure is not None:
            raise failure

    return checked_sync_weights


def naming_the_step(error: BaseException, client: Any, step: int) -> BaseException:
    """A sync's ``error`` as raised: the same class (a timeout stays `ServerTimeoutError`; a stop signal is passed
    on as it is), naming the server and the step."""
    if isinstance(error, StopRequested):
        return error
    url = client.base_url if client is not None else "the vLLM server"
    kind = type(error) if isinstance(error, WeightSyncError) else WeightSyncError
    named = kind(f"Weight sync to {url} before the generation at step {step}: {error}")
    named.__cause__ = error
    return named


def generation_naming_the_step(trainer: Any, client: Any) -> Callable[..., dict]:
    """The client's ``generate``, whose `WeightSyncError` (a timeout, a replaced server) names the step."""
    generate = client.generate

    def generate_at_step(*args: Any, **kwargs: Any) -> dict:
        try:
            return generate(*args, **kwargs)
        except WeightSyncError as error:
            step = trainer.state.global_step
            raise type(error)(f"Generation by {client.base_url} at step {step}: {error}") from error

    return generate_at_step
