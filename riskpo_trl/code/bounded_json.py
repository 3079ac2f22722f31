"""JSON parsing with size, nesting and structure caps, for text a model-written program produced.

``json.loads`` recurses once per nesting level and raises RecursionError on ``[`` x 100,000; every consumer of program
output must be able to treat such text as plain wrong instead of crashing (or stalling) the trainer.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 100
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: linear, no backtracking
# Outside strings, valid JSON has only brackets and these; deleting them (a fast ASCII translate) leaves the brackets
_SKELETON = str.maketrans("[{]}", "(())", "0123456789+-.eE,: \t\r\naflsnrtuNIiy")


class JSONLimitError(ValueError):
    """The text is over the size, nesting or structure cap."""


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, ignoring brackets inside JSON strings; for unbalanced text an upper
    bound. With ``stop_above``, stops as soon as the depth is known to exceed it.

    Each pass deletes every innermost ``()`` pair (C-speed ``str.replace``), so the passes a balanced text takes are
    its depth: a few passes over short skeletons for real values, and at most ``stop_above + 1`` for hostile ones.
    """
    skeleton = _STRING.sub("", text).translate(_SKELETON)  # anything else left is invalid JSON: it only adds depth
    limit = len(skeleton) if stop_above is None else stop_above
    if "(" * (limit + 1) in skeleton:
        return limit + 1
    depth = 0
    while skeleton and depth <= limit:
        reduced = skeleton.replace("()", "")
        if reduced == skeleton:
            break
        skeleton, depth = reduced, depth + 1
    return depth + skeleton.count("(")  # unmatched openers of invalid text: counted as if nested


def loads(text: str | bytes, max_bytes: int, max_depth: int = MAX_DEPTH, max_structure: int | None = None):
    """``json.loads`` of ``text``, or ValueError (JSONLimitError when over ``max_bytes`` characters, ``max_depth``
    nesting, or ``max_structure`` characters outside strings)."""
    if len(text) > max_bytes:
        raise JSONLimitError(f"JSON text of {len(text)} characters is over the cap of {max_bytes}")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if max_structure is not None and len(_STRING.sub("", text)) > max_structure:
        raise JSONLimitError(f"JSON with more than {max_structure} characters outside strings")
    if nesting_depth(text, stop_above=max_depth) > max_depth:
        raise JSONLimitError(f"JSON nested deeper than {max_depth}")
    try:
        return json.loads(text)
    except RecursionError as exc:  # not expected below the depth cap; kept so no parse error escapes as non-ValueError
        raise JSONLimitError("JSON nested too deeply") from exc
