r"""Final-answer grading with math-verify, shared by the rewards, the evaluator and the data adapters.

:func:`verify_answer` grades a completion's *final* answer, read at an anchor (:func:`final_answer_text`), in this
order:

1. the last ``\boxed{}`` (or ``\fbox{}``), anywhere in the completion;
2. else the last explicit answer line in the last ``ANSWER_TAIL_CHARS`` characters: "The answer is 24",
   "The final answer is 24", "Answer: 24", GSM8K's "#### 24" (what follows, to the end of its line);
3. else the completion's final line, when it is an answer on its own: a number or an expression, with no words
   ("24", "$\frac{1}{2}$", "x = 24"), not "check: 10 * 7" nor "15 + 9 = 24 cows." nor "Let's break".

An expression in mid-text is not an answer: a completion clipped mid-reasoning ("... 15 + 9 = 24 cows.\n\nLet's
break") scores 0, so stopping after a number is no way to a reward. TRL's ``accuracy_reward`` needs an anchor
(LaTeX) too. It is a pure, per-pair function, so training rewards and benchmark scores agree. A leaf module: it
imports nothing from ``riskpo_trl``. The RiskPO authors' graders (verl's, :mod:`riskpo_trl.rewards.verl_graders`)
anchor each on one form and are unchanged by this.

Threads: math-verify's timeouts use ``signal.alarm``, which works in the main thread only (math-verify 0.9 raises
there otherwise). Off the main thread we disable them (``parsing_timeout=None`` / ``timeout_seconds=None``, as TRL
does) and bound the work instead by grading only the anchored answer, never the whole reasoning trace.
"""

from __future__ import annotations

import logging
import re
import threading

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Seconds math-verify may spend parsing one expression / comparing two, in the main thread.
PARSING_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
# Without a \boxed{} answer, an answer line is looked for in this many trailing characters (as verl's graders clip).
ANSWER_TAIL_CHARS = 300
# What the completions table shows when the grader read no answer.
NO_ANSWER_READ = "-"

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


# An explicit answer line's anchor: "The (final) answer is", "Answer:", GSM8K's "####"; the value follows it (on the
# next line when the anchor ends its own), to the end of that line.
_ANSWER_ANCHOR = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b|\banswer\s*:|####", re.IGNORECASE)
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_ANSWER_MARKUP = " \t$*.()"


def _bare_answer(line: str) -> str | None:
    """``line`` when it is an answer on its own: a number or an expression with a digit and no words (LaTeX commands
    aside; one variable for ``x = 24``), else None."""
    value = line.strip().strip(_ANSWER_MARKUP)
    words = _LATEX_COMMAND.sub("", value)
    words = re.sub(r"^[a-zA-Z]\s*=", "", words.strip())
    if not value or not any(c.isdigit() for c in value) or re.search(r"[a-zA-Z:]", words):
        return None
    return value


def final_answer_text(text: str) -> tuple[str, bool] | None:
    """The final answer the grader reads, and whether it is a ``\\boxed{}`` body: the last box, else the last answer
    line in the last ``ANSWER_TAIL_CHARS`` characters, else a final line that is an answer on its own; None if none
    of them is there."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, True
    tail = text[-ANSWER_TAIL_CHARS:]
    anchors = list(_ANSWER_ANCHOR.finditer(tail))
    if anchors:
        value = tail[anchors[-1].end() :].lstrip(" \t\n:*").partition("\n")[0].strip()
        if value:
            return value, False
    final_line = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
    bare = _bare_answer(final_line)
    return None if bare is None else (bare, False)


def _parse_final_answer(completion_text: str, parsing_timeout: int | None) -> list:
    found = final_answer_text(completion_text)
    if found is None:
        return []
    answer, boxed = found
    answer = f"\\boxed{{{answer}}}" if boxed else answer
    return parse(answer, extraction_config=_ANSWER_EXTRACTION, parsing_timeout=parsing_timeout)


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
    """What the grader reads as the final answer (:func:`final_answer_text`), for the completions table; ``-`` when it
    reads none."""
    found = final_answer_text(text)
    return NO_ANSWER_READ if found is None else found[0]
