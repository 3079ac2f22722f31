"""Model names that are local paths, not Hub ids: said at once, instead of a Hub lookup that retries for half a minute
and then blames the network (a leaf module)."""

from __future__ import annotations

import os

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


def reads_as_local_path(name: str) -> bool:
    """Whether ``name`` can only mean a local directory: absolute, ``./``, ``../`` or ``~``, not of the Hub's
    ``namespace/name`` form, or under a directory that exists here (``outputs/no-such-model`` next to ``outputs/``)."""
    if os.path.isabs(name) or name.startswith((".", "~")) or os.sep != "/" and os.sep in name:
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    head, _, _ = name.partition("/")
    return bool(_) and os.path.isdir(head)


def hub_id_or_none(name: str | None) -> str | None:
    """``name`` if it reads as a Hub repository id and is not a local path, else None."""
    if not name or os.path.exists(name) or reads_as_local_path(name):
        return None
    return name


def check_model_path(name: str, what: str = "model") -> None:
    """Raise FileNotFoundError for a ``name`` that reads as a local path (see `reads_as_local_path`) but does not
    exist, naming it as such; a Hub id or an existing path passes."""
    if os.path.exists(name) or not reads_as_local_path(name):
        return
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(name)))
    hint = (
        f" ({os.path.dirname(name)}/ exists here, so this is read as a local path)"
        if os.path.isdir(parent) and not os.path.isabs(name) and "/" in name else ""
    )
    raise FileNotFoundError(
        f"{what} {name!r}: no such directory, and not a Hub id{hint}. Give an existing directory (saved with "
        "save_pretrained) or a Hub id such as 'Qwen/Qwen2.5-Math-1.5B-Instruct'; riskpo-train's build_tiny_model: "
        "true builds a tiny random model at a missing path."
    )
