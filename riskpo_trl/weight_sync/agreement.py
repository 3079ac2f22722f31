"""Every process of a multi-process run ends a failed sync or generation together, at the same point.

Only the main process talks to the server; the others wait for it in a collective: after a sync, in the gather of
the next generation's prompts, and during a generation, in the broadcast of its completions. A failure the main
process raised there (a timeout, a dead server, a failed check, a stop signal that cut its wait short) would leave
them waiting until torch's own timeout, and the stop path's own collectives (the checkpoint, ``wait_for_everyone``)
would never match. So the main process never raises alone:

- a **sync**'s outcome is broadcast from the main process after it (`agree_on_sync`), and every process raises the
  same error there;
- a **generation**'s failure completes TRL's own broadcast of the completions with a `StopMarker` in place of the
  prompt ids (`stop_marker_output`); unpickling the marker records the error in each receiving process, and
  `raise_agreed_failure`, after TRL's generate returns, raises it in every process.

In every process the error has the class (`ServerTimeoutError`, `ServerUnreachableError`, `WeightSyncError`,
`StopRequested`) and the message of the main process's, so each takes the same stop path (job.preemption).
"""

from __future__ import annotations

from typing import Any

from .bounded import ServerTimeoutError, ServerUnreachableError, StopRequested, WeightSyncError

# What a failure is rebuilt as in the other processes; any other error becomes a RuntimeError with its message.
_KINDS = {kind.__name__: kind for kind in (WeightSyncError, ServerTimeoutError, ServerUnreachableError)}
# The failures received in this process (through `StopMarker`) and not raised yet.
_received: list[BaseException] = []

Failure = Exception | StopRequested


def describe(error: BaseException | None) -> tuple[str, str] | None:
    """``(kind, message)`` of ``error`` (the signal's name for `StopRequested`), or None."""
    if error is None:
        return None
    if isinstance(error, StopRequested):
        return "StopRequested", error.signal_name
    return type(error).__name__, str(error)


def rebuild(description: tuple[str, str]) -> BaseException:
    """The error `describe` described, as another process raises it."""
    kind, message = description
    if kind == "StopRequested":
        return StopRequested(message)
    return _KINDS.get(kind, RuntimeError)(message)


def _arrived(kind: str, message: str) -> list:
    """Unpickling a `StopMarker`: records its failure in this process; TRL then reads an empty list of prompts."""
    _received.append(rebuild((kind, message)))
    return []


class StopMarker(list):
    """An empty list of prompt ids that carries a failure of the main process's generation to every other process
    (see the module docstring)."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.description = describe(error)

    def __reduce__(self):
        return _arrived, self.description


def stop_marker_output(error: BaseException) -> dict[str, list]:
    """What the main process's client returns instead of raising ``error``: a generation's output with no
    completions, whose prompt ids carry ``error`` through TRL's broadcast."""
    return {"prompt_ids": StopMarker(error), "completion_ids": [], "logprobs": [], "logprob_token_ids": []}


class GenerationOutcome:
    """The main process's failure of the current generation, raised after TRL's generate has completed its
    broadcast (`raise_agreed_failure`)."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None


def raise_agreed_failure(outcome: GenerationOutcome) -> None:
    """After TRL's generate returned: the main process's own failure, or the one this process received; else
    nothing."""
    failure, outcome.failure = outcome.failure, None
    if failure is None and _received:
        failure = _received.pop()
    _received.clear()
    if failure is not None:
        raise failure


def agree_on_sync(failure: BaseException | None) -> None:
    """After a sync, in every process (a collective): raise the main process's ``failure`` everywhere, if it had
    one; the others pass None."""
    from accelerate.utils import broadcast_object_list

    outcome = [describe(failure)]
    broadcast_object_list(outcome, from_process=0)
    if failure is not None:
        raise failure
    if outcome[0] is not None:
        raise rebuild(outcome[0])


def generate_agreeing(generate: Any, outcome: GenerationOutcome) -> Any:
    """The main process's ``client.generate``: a failure is kept in ``outcome`` and returned as a `StopMarker`
    output, which TRL broadcasts to the others."""

    def generate_or_mark(*args: Any, **kwargs: Any) -> dict:
        try:
            return generate(*args, **kwargs)
        except (Exception, StopRequested) as error:
            outcome.failure = error
            return stop_marker_output(error)

    return generate_or_mark


def trl_generate_agreeing(trl_generate: Any, outcome: GenerationOutcome) -> Any:
    """TRL's ``VLLMGeneration.generate`` in every process, raising the agreed failure once it returns."""

    def generate_then_raise(*args: Any, **kwargs: Any) -> Any:
        _received.clear()
        output = trl_generate(*args, **kwargs)
        raise_agreed_failure(outcome)
        return output

    return generate_then_raise
