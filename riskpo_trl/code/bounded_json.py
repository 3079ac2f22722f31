"""JSON parsing with a size and nesting cap, for text a model-written program produced.

``json.loads`` recurses once per nesting level and raises RecursionError on ``[`` x 100,000; every consumer of program
output must be able to treat such text as plain wrong instead of crashing the trainer.
"""

from __future__ import annotations

import itertools
import json
import re

MAX_DEPTH = 100
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[^\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONLimitError(ValueError):
    """The text is over the size or nesting cap."""


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, ignoring brackets inside JSON strings (linear time)."""
    brackets = _BRACKETS.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(text: str | bytes, max_bytes: int, max_depth: int = MAX_DEPTH):
    """``json.loads`` of ``text``, or ValueError (JSONLimitError when over ``max_bytes`` or ``max_depth``)."""
    if len(text) > max_bytes:
        raise JSONLimitError(f"JSON text of {len(text)} characters is over the cap of {max_bytes}")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if nesting_depth(text) > max_depth:
        raise JSONLimitError(f"JSON nested deeper than {max_depth}")
    try:
        return json.loads(text)
    except RecursionError as exc:  # cannot happen below the depth cap; kept so no parse error escapes as non-ValueError
        raise JSONLimitError("JSON nested too deeply") from exc
