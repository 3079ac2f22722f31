"""JSON parsing with size and nesting caps, for text a model-written program produced.

``json.loads`` recurses once per nesting level (in C); every consumer of program output must be able to treat deeply
nested text as plain wrong instead of crashing or stalling the trainer, and the values it returns must be shallow
enough for the recursive comparisons that follow. Every step here is linear in the text and uses no regular
expression (a backtracking pattern over a string of backslashes took tens of seconds and gigabytes).
"""

from __future__ import annotations

import json

from .values import int_from_decimal

MAX_DEPTH = 100
# Outside strings, valid JSON has only brackets and these; deleting them (a fast translate) leaves the brackets
_SKELETON = str.maketrans("[{]}", "(())", "0123456789+-.eE,: \t\r\naflsnrtuNIiy")


class JSONLimitError(ValueError):
    """The text is over the size or nesting cap."""


def _outside_strings(text: str) -> str:
    """``text`` without its JSON string literals: escape pairs are dropped first (C-speed ``str.replace``, so a run
    of backslashes costs one pass), then every other piece between unescaped quotes is string content."""
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    return "".join(unescaped.split('"')[::2])


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, ignoring brackets inside JSON strings; for unbalanced text an upper
    bound. With ``stop_above``, stops as soon as the depth is known to exceed it.

    Each pass deletes every innermost ``()`` pair (C-speed ``str.replace``), so the passes a balanced text takes are
    its depth: a few passes over short skeletons for real values, and at most ``stop_above + 1`` for hostile ones.
    """
    skeleton = _outside_strings(text).translate(_SKELETON)  # anything else left is invalid JSON: it only adds depth
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


def _bounded_int(digits: str) -> int:
    """An integer literal, also beyond the interpreter's int/str digit limit (4,300 by default), up to
    `MAX_INT_DIGITS` digits."""
    try:
        return int_from_decimal(digits)
    except ValueError as exc:
        raise JSONLimitError(str(exc)) from None


def loads(text: str | bytes, max_bytes: int, max_depth: int = MAX_DEPTH):
    """``json.loads`` of ``text``, or ValueError (JSONLimitError when over ``max_bytes`` characters or ``max_depth``
    nesting)."""
    if len(text) > max_bytes:
        raise JSONLimitError(f"JSON text of {len(text)} characters is over the cap of {max_bytes}")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    openers = text.count("[") + text.count("{")
    if openers > max_depth and nesting_depth(text, stop_above=max_depth) > max_depth:
        raise JSONLimitError(f"JSON nested deeper than {max_depth}")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError as exc:  # not expected below the depth cap; kept so no parse error escapes as non-ValueError
        raise JSONLimitError("JSON nested too deeply") from exc
