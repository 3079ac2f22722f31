"""Every request a trainer makes to a vLLM server, bounded in time, and the errors a failed one raises.

`BoundedRequestsMixin` goes in front of TRL's `VLLMClient`: TRL's own requests (generation, the server's info, the
prompt log-probs) get a read timeout, and TRL's retries no longer repeat a request whose answer timed out. A
generation waits at most `generation_timeout` for the server's answer (derived from the batch unless set); any
other request at most ``SyncSettings.sync_timeout_s``. A request that times out is `ServerTimeoutError`, which the
training script turns into a checkpoint and exit code 75, as on a scheduler's signal (`job.preemption`).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Connecting to the server fails after this many seconds, whatever the request.
CONNECT_TIMEOUT_S = 10.0
# A short request (the server's identity, its readiness, the probe's log-probs) gets this long to answer.
QUICK_TIMEOUT_S = 60.0
# The defaults of the settings below (riskpo-train's --vllm_sync_timeout and --vllm_check_every).
DEFAULT_SYNC_TIMEOUT_S = 120.0
DEFAULT_CHECK_EVERY = 10
# A generation's derived timeout: this floor, plus this much per token the batch may generate. Generous on purpose:
# 300 s and 1 ms per token, i.e. a server slower than 1000 tokens/s on a large batch could be stopped by mistake.
GENERATION_TIMEOUT_FLOOR_S = 300.0
GENERATION_SECONDS_PER_TOKEN = 1e-3


class WeightSyncError(RuntimeError):
    """The server does not generate with the weights the trainer sent: an update that did not land, a server that was
    replaced, or a sync that broke off."""


class ServerTimeoutError(WeightSyncError):
    """The server did not answer a request within its timeout: it hangs, or is far slower than the timeout allows.
    The training script stops at a checkpoint with exit code 75 (the same command resumes)."""

    stop_reason = "a vLLM server timeout"  # the stop line's "Stopped by ..."


class ServerUnreachableError(ServerTimeoutError):
    """The server refused or dropped the connection of a request: it died or restarts. The training script stops as
    after a timeout (a checkpoint, exit code 75): the same command resumes once a server answers again."""

    stop_reason = "a vLLM server that stopped answering"


class StopRequested(BaseException):  # noqa: N818 -- a request, like KeyboardInterrupt, not an error
    """A stop signal (SIGINT, SIGTERM, SIGUSR1) that arrived while the main thread waited on the server
    (`interruptible_wait`): the wait is abandoned, and the run stops at once with a checkpoint of its last step
    (job.preemption). A BaseException, so that no library's ``except Exception`` swallows it."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class ServerRefusedError(ValueError):
    """At start-up: a server this trainer cannot sync its weights to safely (the fix is in the message)."""


@dataclass(frozen=True)
class SyncSettings:
    """A job's settings for its vLLM server, whichever trainer it builds: riskpo-train's ``--vllm_generation_timeout``,
    ``--vllm_sync_timeout`` and ``--vllm_check_every``, or ``riskpo_trl.job.build(..., weight_sync=SyncSettings(...))``.
    A value out of range is refused here, naming the option."""

    generation_timeout_s: float | None = None  # None: derived from each batch (`generation_timeout`)
    sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S
    check_every: int = DEFAULT_CHECK_EVERY

    def __post_init__(self):
        timeouts = {"vllm_generation_timeout": self.generation_timeout_s, "vllm_sync_timeout": self.sync_timeout_s}
        for name, value in timeouts.items():
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value} must be > 0 seconds (docs/scale_out.md).")
        if self.check_every < 1:
            raise ValueError(
                f"vllm_check_every={self.check_every} must be >= 1 (1 checks every weight sync; the server's "
                "identity is checked on every request anyway)."
            )


_waiting = threading.local()
_pending: list[str] = []  # a stop signal that arrived outside a wait: the next wait of the main thread ends at once


@contextlib.contextmanager
def interruptible_wait() -> Iterator[None]:
    """Within the block, a stop signal's handler may raise `StopRequested` (`interrupt_wait`): the thread waits on the
    server there, and a stop must not wait out that request's timeout. A stop signal that arrived while the main
    thread was busy elsewhere (between two tensors of a sync) ends the next wait as it starts."""
    if _pending and threading.current_thread() is threading.main_thread():
        raise StopRequested(_pending.pop())
    previous = getattr(_waiting, "active", False)
    _waiting.active = True
    try:
        yield
    finally:
        _waiting.active = previous


def interrupt_wait(signal_name: str) -> None:
    """From a signal handler: raise `StopRequested` if the main thread is inside `interruptible_wait`; else record
    it for the next wait (the stop may also come first at the next step boundary)."""
    if getattr(_waiting, "active", False):
        _waiting.active = False  # one interruption per wait: the stop's own clean-up is not interrupted again
        raise StopRequested(signal_name)
    _pending[:] = [signal_name]


def forget_stop_signal() -> None:
    """A new run starts: no stop signal is pending."""
    _pending.clear()


# gloo's messages end some errors with a greeting ("GLHF!" and an emoji), which says nothing about the fault.
_LIBRARY_NOISE = re.compile(r"\s*GLHF!?(?:\s*[^\x00-\x7f])*")


def error_text(error: BaseException) -> str:
    """``error``'s message for a one-line report: the exception's class when it has no text of its own (a future's
    timeout), without gloo's greeting, on one line."""
    text = _LIBRARY_NOISE.sub("", str(error))
    text = " ".join(text.split()).strip()
    return text or type(error).__name__


def generation_timeout(settings: SyncSettings, prompts: int, completions_per_prompt: int, max_tokens: int) -> float:
    """How long one generation request may wait for the server's answer: the setting, or
    ``GENERATION_TIMEOUT_FLOOR_S`` plus ``GENERATION_SECONDS_PER_TOKEN`` per token the batch may generate."""
    if settings.generation_timeout_s is not None:
        return settings.generation_timeout_s
    tokens = prompts * completions_per_prompt * max_tokens
    return GENERATION_TIMEOUT_FLOOR_S + math.ceil(tokens * GENERATION_SECONDS_PER_TOKEN)


class BoundedRequestsMixin:
    """In front of TRL's `VLLMClient` (module docstring). ``settings`` is a class attribute: TRL's constructor
    already sends requests."""

    settings = SyncSettings()
    _read_timeout_s: float | None = None  # while a generation runs: its timeout
    _request_name = "a request"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._mount_bounded_retries()
        super().__init__(*args, **kwargs)
        self._mount_bounded_retries()  # TRL's constructor mounts its own adapter
        import requests

        self._control_session = requests.Session()  # no retries: a weight-sync request must not run twice

    def _mount_bounded_retries(self) -> None:
        """TRL's retries, less those after a read timeout (each would wait the whole timeout again)."""
        session = getattr(self, "session", None)
        if session is None:
            return
        from requests.adapters import HTTPAdapter, Retry

        retry = Retry(
            total=5,
            connect=5,
            read=False,
            status=3,
            status_forcelist=[500, 502, 503],
            backoff_factor=2,
            allowed_methods=["POST", "GET"],
        )
        adapter = HTTPAdapter(max_retries=retry, pool_maxsize=16)
        session.mount("http://", adapter)
        session.mount("https://", adapter)

    def _get(self, url: str, **kwargs: Any) -> dict:
        return self._bounded(self.session.get, url, kwargs)

    def _post(self, url: str, **kwargs: Any) -> dict:
        return self._bounded(self.session.post, url, kwargs)

    def _bounded(self, send: Any, url: str, kwargs: dict) -> dict:
        """TRL's ``_get``/``_post`` with a timeout; a timeout or a lost connection names the server and request."""
        import requests

        timeout = self._read_timeout_s or self.settings.sync_timeout_s
        path = url.removeprefix(getattr(self, "base_url", ""))
        try:
            with interruptible_wait():
                response = send(url, timeout=(CONNECT_TIMEOUT_S, timeout), **kwargs)
        except requests.Timeout as error:
            raise self.timed_out(path, self._request_name, timeout, error) from error
        except requests.ConnectionError as error:  # refused (after TRL's retries), reset or dropped mid-answer
            raise self.unreachable(path, self._request_name, error) from error
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")  # TRL's own error
        return response.json()

    def timed_out(self, path: str, what: str, timeout: float, error: Exception) -> ServerTimeoutError:
        return ServerTimeoutError(
            f"The vLLM server at {self.base_url} did not answer {path} ({what}) within {timeout:g} s: "
            f"{error_text(error)}"
        )

    def unreachable(self, path: str, what: str, error: Exception) -> ServerUnreachableError:
        return ServerUnreachableError(
            f"The vLLM server at {self.base_url} did not answer {path} ({what}): the connection was refused or "
            f"dropped ({error_text(error)}). Is the server still running?"
        )

    def generate(self, prompts: list, *args: Any, n: int = 1, max_tokens: int = 16, **kwargs: Any) -> dict:
        timeout = generation_timeout(self.settings, len(prompts), n, max_tokens)
        self._read_timeout_s, self._request_name = timeout, "generation"
        try:
            return super().generate(prompts, *args, n=n, max_tokens=max_tokens, **kwargs)
        finally:
            self._read_timeout_s, self._request_name = None, "a request"

    @property
    def quick_timeout_s(self) -> float:
        """A short request's timeout during training: ``QUICK_TIMEOUT_S``, or the sync timeout if shorter."""
        return min(QUICK_TIMEOUT_S, self.settings.sync_timeout_s)

    def control(
        self, method: str, path: str, timeout: float | None = None, *, read_only: bool = False, **kwargs: Any
    ) -> Any:
        """One request of the weight sync, without TRL's retries; a network error, a timeout or an error status is
        `WeightSyncError` naming the server and the request (`ServerTimeoutError` for a timeout). A ``read_only``
        query is sent once more on a fresh connection after a reset: the server may have closed a pooled connection
        when it failed the request before (a timeout is never retried)."""
        import requests

        timeout = timeout or self.settings.sync_timeout_s
        url, limits = f"{self.base_url}{path}", (CONNECT_TIMEOUT_S, timeout)
        try:
            with interruptible_wait():
                try:
                    response = self._control_session.request(method, url, timeout=limits, **kwargs)
                except requests.ConnectionError as error:
                    if not read_only or isinstance(error, requests.Timeout):  # ConnectTimeout is both
                        raise
                    self._control_session.close()  # drops the pooled connections
                    response = self._control_session.request(method, url, timeout=limits, **kwargs)
        except requests.Timeout as error:
            raise self.timed_out(path, "a weight-sync request", timeout, error) from error
        except requests.ConnectionError as error:
            raise self.unreachable(path, "a weight-sync request", error) from error
        except requests.RequestException as error:
            raise WeightSyncError(
                f"The vLLM server at {self.base_url} did not answer {path}: {error_text(error)}"
            ) from error
        if response.status_code != 200:
            raise WeightSyncError(
                f"The vLLM server at {self.base_url} answered {path} with {response.status_code}: "
                f"{error_text(RuntimeError(response.text[:500]))}"
            )
        return response.json() if response.content else None
