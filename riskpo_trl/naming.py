"""'Did you mean' hints for misspelled names (a leaf module)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_name(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest of ``choices`` to a misspelled ``name``, or '' when none is close."""
    match = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""
