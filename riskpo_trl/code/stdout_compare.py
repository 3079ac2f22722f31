"""Whether a program's stdout matches a stdin/stdout test's expected output, with LiveCodeBench's number semantics.

LiveCodeBench's grader strips both texts, splits them into lines at ``\\n``, strips each line and needs as many lines
on both sides; a line passes when it is identical, or when every whitespace-separated token on both sides parses as a
Python ``decimal.Decimal`` and the two lists of Decimals are equal (so ``0.50`` matches ``0.5``, ``3.0000000000``
matches ``3.0`` and ``1e3`` matches ``1000``, while ``0.5000001`` does not match ``0.5``: there is no tolerance).

`stdout_matches` passes everything that grader passes and, token by token, a little more: tokens are compared in
order, each pair passing when the two strings are identical or when both parse as Decimals that are equal. So a line
that mixes words and numbers (``Case #1: 0.50``) passes when its words are identical and its numbers equal, and runs
of whitespace inside a line never matter (LiveCodeBench fails both unless the lines are identical).

A pure function whose work is linear in the size of its inputs: one split, and for each pair of differing tokens at
most two Decimal parses and one comparison, each linear in the token's digits. Nothing is hashed, formatted or
evaluated; the caller bounds the sizes (`TestSpec.output_caps`).
"""

from __future__ import annotations

from decimal import Decimal, DecimalException


def _lines(text: str) -> list[str]:
    """The text stripped and split at ``\\n`` (each line is split into tokens only when it is compared)."""
    return text.strip().split("\n")


def _number(token: str) -> Decimal | None:
    try:
        return Decimal(token)
    except (DecimalException, ValueError):
        return None


def tokens_match(observed: str, expected: str) -> bool:
    """Identical, or both numbers (as ``decimal.Decimal`` parses them) that are equal; a NaN equals nothing."""
    if observed == expected:
        return True
    got, want = _number(observed), _number(expected)
    if got is None or want is None:
        return False
    try:
        return got == want
    except DecimalException:  # a signalling NaN raises on comparison
        return False


def stdout_matches(observed: str, expected: str) -> bool:
    """Whether ``observed`` stdout matches ``expected``: the same number of lines and, on each line, the same number
    of whitespace-separated tokens, each pair matching by `tokens_match`."""
    got_lines, want_lines = _lines(observed), _lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    for got, want in zip(got_lines, want_lines):  # one line's tokens at a time: no list per line is kept
        got_tokens, want_tokens = got.split(), want.split()
        if len(got_tokens) != len(want_tokens) or not all(map(tokens_match, got_tokens, want_tokens)):
            return False
    return True
