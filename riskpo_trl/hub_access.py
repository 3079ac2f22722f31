"""Whether the Hugging Face Hub can be reached, asked once per process, so that a command fails at once offline.

Without a network, ``datasets`` and ``transformers`` retry every Hub request for tens of seconds before they give
up, once per dataset and per model. :func:`use_offline_mode_if_unreachable` asks once (one request, a short timeout,
the proxies of ``huggingface_hub``'s session) and, when the Hub does not answer, switches the libraries to their
offline mode (``HF_HUB_OFFLINE=1``): what is in the local caches still loads, anything else fails at once with the
caller's message. ``HF_HUB_OFFLINE`` set by the user is honoured without a request.
"""

from __future__ import annotations

import functools
import os
import sys

PROBE_TIMEOUT_S = 5.0
OFFLINE_BY_USER = "HF_HUB_OFFLINE is set"


def offline_by_user() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached (``HF_HUB_OFFLINE`` set, or the connection's error), or None if it answered.
    Asked once per process."""
    if offline_by_user():
        return OFFLINE_BY_USER
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - any failure to connect means unreachable; the message names it
        return f"{constants.ENDPOINT} did not answer: {type(error).__name__}: {error}".rstrip(": ")
    return None


def use_offline_mode_if_unreachable() -> str | None:
    """Switch ``huggingface_hub``, ``datasets`` and ``transformers`` (and processes started later) to offline mode
    if the Hub cannot be reached; return why, or None when it can."""
    reason = hub_unreachable()
    if reason is None or reason == OFFLINE_BY_USER:
        return reason
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:  # read at its import; an import after this reads the environment
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    return reason
