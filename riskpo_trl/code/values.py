"""Values a program reported, decoded in the judge process, and how they are compared with expected values.

The runner encodes what a program returned as JSON of builtin values (`riskpo_trl.code._harness.encode_value`):
tuples as lists, sets as ``{"__set__": items}``, dicts with other than str keys as ``{"__dict__": pairs}``, bytes as
``{"__bytes__": latin-1}``, other objects as ``{"__object__": type name}``, and an assertion sub-expression that
raised as ``{"__raised__": exception name}``. `decode_value` turns that back into Python values (inside sets and dict
keys, lists become tuples so they can be hashed), and `values_equal` is the one comparison every test style uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Opaque:
    """A reported object of a non-builtin type: equal to nothing, not None, and of unknown truth."""

    type_name: str


@dataclass(frozen=True)
class Raised:
    """An assertion sub-expression that raised instead of giving a value."""

    exception: str


_SAFE_DIGITS = 4000  # below CPython's default int/str conversion limit (4,300 digits)
MAX_INT_DIGITS = 100_000  # the longest decimal integer converted (in quadratic time); no real test comes close


def int_from_decimal(text: str) -> int:
    """``int(text)`` for a decimal integer of up to `MAX_INT_DIGITS` digits, also beyond the interpreter's conversion
    limit, without lifting that limit (which would lift it for every thread): chunks below it are combined."""
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits is over the cap of {MAX_INT_DIGITS}")
    if len(digits) <= _SAFE_DIGITS:
        return int(text)
    half = len(digits) // 2
    value = int_from_decimal(digits[:half]) * 10 ** (len(digits) - half) + int_from_decimal(digits[half:])
    return -value if text.startswith("-") else value


def int_to_decimal(value: int) -> str:
    """``str(value)`` for any int, without lifting the interpreter's conversion limit (see `int_from_decimal`)."""
    if value < 0:
        return "-" + int_to_decimal(-value)
    if value.bit_length() < 13_000:  # under 3,914 digits
        return str(value)
    half = int(value.bit_length() * 0.30103) // 2  # half its digits (log10 2 = 0.30103)
    high, low = divmod(value, 10**half)
    return int_to_decimal(high) + int_to_decimal(low).rjust(half, "0")


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):  # a dict cannot be a set item or key in Python either: compare it by its items
        return tuple(sorted(((repr(key), _hashable(item)) for key, item in value.items())))
    return value


def decode_value(value, hashable: bool = False):
    """The Python value a program reported (from parsed JSON); ``hashable`` gives tuples for lists."""
    if isinstance(value, list):
        items = [decode_value(item, hashable) for item in value]
        return tuple(items) if hashable else items
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, content),) = value.items()
        if tag == "__set__" and isinstance(content, list):
            return frozenset(decode_value(item, hashable=True) for item in content)
        if (
            tag == "__dict__"
            and isinstance(content, list)
            and all(isinstance(pair, list) and len(pair) == 2 for pair in content)
        ):
            return {decode_value(key, hashable=True): decode_value(item) for key, item in content}
        if tag == "__bytes__" and isinstance(content, str):
            return content.encode("latin-1", errors="replace")
        if tag == "__object__":
            return Opaque(str(content))
        if tag == "__raised__":
            return Raised(str(content))
    decoded = {key: decode_value(item) for key, item in value.items()}
    return _hashable(decoded) if hashable else decoded


def values_equal(got, want) -> bool:
    """Whether a reported value ``got`` matches the expected ``want``.

    Exact for strings, bytes, sets, dict keys and bools (``True`` is not ``1``); lists and tuples compare as sequences.
    An expected int needs an int, or a float that is exactly that integer; an expected float accepts a number within
    1e-6 relative or absolute tolerance. Never raises on numbers: ints too large for a float (``10**400``) compare
    exactly, NaN equals NaN and an infinity only itself.
    """
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(want, int):
        if isinstance(got, float):
            return math.isfinite(got) and got.is_integer() and int(got) == want
        return isinstance(got, int) and got == want
    if isinstance(want, float):
        return isinstance(got, (int, float)) and _close(got, want)
    if isinstance(want, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(want)
            and all(values_equal(g, w) for g, w in zip(got, want))
        )
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(values_equal(got[key], want[key]) for key in want)
        )
    if isinstance(want, (Opaque, Raised)) or isinstance(got, (Opaque, Raised)):
        return False
    if isinstance(want, (set, frozenset)):
        return isinstance(got, (set, frozenset)) and got == want
    if want is None:
        return got is None
    return type(got) is type(want) and got == want


def _close(got: float, want: float) -> bool:
    if got == want:  # exact, also for int/float mixes (Python compares those exactly)
        return True
    try:
        got = float(got)
    except OverflowError:  # an int beyond float range is not within tolerance of any finite float
        return False
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
