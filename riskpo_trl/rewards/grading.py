r"""Final-answer grading with math-verify, shared by the rewards, the evaluator and the data adapters.

:func:`verify_answer` grades a completion's *final* answer: the last ``\boxed{}`` when there is one, otherwise the
plain-text tail ("The answer is 42", "Answer: 42", GSM8K style). It is a pure, per-pair function, so training rewards
and benchmark scores agree. A leaf module: it imports nothing from ``riskpo_trl``.

Threads: math-verify's timeouts use ``signal.alarm``, which works in the main thread only (math-verify 0.9 raises
there otherwise). Off the main thread we disable them (``parsing_timeout=None`` / ``timeout_seconds=None``, as TRL
does) and bound the work instead by grading only the final answer: a ``\boxed{}`` body or the last
``PLAIN_ANSWER_TAIL_CHARS`` characters of the completion, never the whole reasoning trace.
"""

from __future__ import annotations

import logging
import threading

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Seconds math-verify may spend parsing one expression / comparing two, in the main thread.
PARSING_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
# Without a \boxed{} answer, only this many trailing characters are searched for a plain final answer.
PLAIN_ANSWER_TAIL_CHARS = 300

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_EXTRACTION = [
    LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0),
    ExprExtractionConfig(),
]


def _timeouts() -> tuple[int | None, int | None]:
    """(parsing, verify) timeouts: signal-based timeouts only work in the main thread, so elsewhere disable them."""
    if threading.current_thread() is threading.main_thread():
        return PARSING_TIMEOUT_S, VERIFY_TIMEOUT_S
    # math-verify warns once that timeouts are off; that is intended here.
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    return None, None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent."""
    start = max(text.rfind(command + "{") for command in _BOXED_COMMANDS)
    if start < 0:
        return None
    open_brace = text.index("{", start)
    close = matching_brace(text, open_brace)
    return None if close is None else text[open_brace + 1 : close]  # None: unclosed, e.g. a truncated completion


def matching_brace(text: str, start: int) -> int | None:
    """The index of the ``}`` at which the braces counted from ``text[start]`` on first balance; None if never."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _parse_gold(gold: str, parsing_timeout: int | None) -> list:
    gold = gold.strip()
    if not gold:
        return []
    # Gold answers are bare ("42", "\frac{1}{2}", "$2^{1009}$"); boxing them makes math-verify read them as LaTeX.
    boxed = gold if last_boxed(gold) is not None else f"\\boxed{{{gold}}}"
    parsed = parse(boxed, parsing_timeout=parsing_timeout)
    # math-verify falls back to the raw string when it reads no expression ("???"): that gold is unscorable.
    return parsed if any(not isinstance(item, str) for item in parsed) else []


def _parse_final_answer(completion_text: str, parsing_timeout: int | None) -> list:
    boxed = last_boxed(completion_text)
    if boxed is not None:
        return parse(f"\\boxed{{{boxed}}}", extraction_config=_ANSWER_EXTRACTION, parsing_timeout=parsing_timeout)
    tail = completion_text[-PLAIN_ANSWER_TAIL_CHARS:]
    return parse(tail, extraction_config=_ANSWER_EXTRACTION, parsing_timeout=parsing_timeout)


def verify_answer(completion_text: str, gold: str) -> float | None:
    """Grade one completion's final answer against the gold answer with math-verify.

    Returns 1.0 if equivalent, 0.0 if not (no answer found, unparseable answer, timeout or any math-verify error
    count as wrong), and None if the *gold* answer cannot be parsed: the pair is unscorable, not wrong. Never raises on
    odd text; safe to call from worker threads.
    """
    parsing_timeout, verify_timeout = _timeouts()
    try:
        gold_parsed = _parse_gold(str(gold), parsing_timeout)
    except Exception:  # math-verify / sympy can fail on malformed LaTeX in the gold answer
        return None
    if not gold_parsed:
        return None
    try:
        answer_parsed = _parse_final_answer(completion_text, parsing_timeout)
        if not answer_parsed:
            return 0.0
        return float(verify(gold_parsed, answer_parsed, timeout_seconds=verify_timeout))
    except Exception:
        return 0.0


def final_answer_preview(text: str) -> str:
    """What the grader reads as the final answer, shortened for the completions table."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else text[-40:]
