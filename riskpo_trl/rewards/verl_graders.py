r"""The three graders of the RiskPO authors' published pipeline (verl 0.4.1's stock scorers), re-implemented from
what they do. Each grades one completion's text against one gold answer and never raises; all three compare strings,
so they are mostly stricter than math-verify (:mod:`riskpo_trl.rewards.grading`, whose brace matcher they share):

- :func:`gsm8k_strict_score` (``verl/utils/reward_score/gsm8k.py``, strict mode): the last ``#### <number>`` in the
  completion's last 300 characters, commas dropped, must equal the gold string. 1.0 or 0.0. A ``\boxed{72}`` answer
  scores 0.0 - and the authors' data script asks GSM8K prompts for ``\boxed{}``.
- :func:`math_equiv_score` (``math.py``): the last ``\boxed{...}`` (or the text after a ``\boxed `` with a space),
  normalised by the Hendrycks MATH rules, must equal the normalised gold string. 1.0 or 0.0. No algebra: ``0.5``
  matches ``\frac{1}{2}`` (a special case of the rules) but ``0.50``, ``\frac{2}{4}`` or ``5.0`` for ``5`` do not.
- :func:`dapo_answer_score` (``math_dapo.py``): the last ``Answer: ...`` line in the last 300 characters, normalised
  by the Minerva rules, must equal the normalised gold string. 1.0 or -1.0 (their scorer's values; a miss is -1).

verl routes each row to one of them by its ``data_source`` (``default_compute_score``): GSM8K rows to the first, MATH
rows to the second, DAPO-Math-17k (and AIME) rows to the third; :func:`grader_for_source` does the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .grading import matching_brace

# Both scorers that clip read only this many trailing characters of the completion.
TAIL_CHARS = 300

# --- GSM8K, strict ---------------------------------------------------------------------------------------------------

_GSM8K_STRICT_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def gsm8k_strict_answer(text: str) -> str | None:
    """The number after the last ``#### `` in the last 300 characters, commas dropped; None if there is none."""
    found = _GSM8K_STRICT_ANSWER.findall(text[-TAIL_CHARS:])
    return found[-1].replace(",", "") if found else None


def gsm8k_strict_score(text: str, gold: str) -> float:
    """1.0 if the strict GSM8K answer equals ``gold`` as a string, else 0.0 (``72.0`` is not ``72``)."""
    return float(gsm8k_strict_answer(text) == gold)


# --- MATH: string equivalence after the Hendrycks normalisation ------------------------------------------------------


class _Unnormalisable(Exception):
    """The normalisation fails on this string (verl then compares the raw strings)."""


def math_boxed_answer(text: str) -> str | None:
    r"""What the MATH scorer reads as the answer: after ``\boxed `` (space form, wherever it is; up to a ``$``), else
    the body of the last ``\boxed{...}``; None if there is none, the braces never close, or the last ``\boxed`` is
    not followed by ``{`` (``\fbox`` answers included: the scorer gives them 0)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    end = matching_brace(text, start)  # counted from the command, as verl does
    if end is None or not text.startswith("\\boxed{", start):
        return None
    return text[start + len("\\boxed{") : end]


def _brace_sqrt_arguments(text: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}`` (one character)."""
    head, *pieces = text.split("\\sqrt")
    for piece in pieces:
        if not piece:
            raise _Unnormalisable
        head += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return head


def _brace_frac_arguments(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` -> ``\frac{1}{72}``; a ``\frac`` with fewer than two characters
    after it leaves the whole string as it was."""
    head, *pieces = text.split("\\frac")
    for piece in pieces:
        if not piece:
            raise _Unnormalisable
        head += "\\frac"
        if piece[0] == "{":
            head += piece
        elif len(piece) < 2:
            return text
        elif piece[1] == "{":
            head += "{" + piece[0] + "}" + piece[1:]
        else:
            head += "{" + piece[0] + "}{" + piece[1] + "}" + piece[2:]
    return head


def _slash_to_frac(text: str) -> str:
    """``3/4`` (two plain integers) -> ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{numerator}}}{{{denominator}}}" if text == f"{numerator}/{denominator}" else text


def hendrycks_normalise(answer: str) -> str:
    """The MATH scorer's normalisation: drop spacing, ``\\left``/``\\right``, degrees, dollars, percent, units after
    ``\\text{ ``, a short ``x =`` prefix; brace ``\\sqrt``/``\\frac`` arguments; ``0.5`` and ``a/b`` become fractions.
    Raises ``_Unnormalisable`` where the original rules fail."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        answer = answer.replace(old, new)
    if "\\text{ " in answer:  # a unit on the right
        value, *units = answer.split("\\text{ ")
        if len(units) != 1:
            raise _Unnormalisable
        answer = value
    # verl removes \% twice (two identical calls), so a \% that the first removal forms goes too.
    answer = answer.replace("\\%", "").replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not answer:
        return answer
    if answer[0] == ".":
        answer = "0" + answer
    sides = answer.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        answer = sides[1]
    answer = _brace_frac_arguments(_brace_sqrt_arguments(answer).replace(" ", ""))
    if answer == "0.5":
        answer = "\\frac{1}{2}"
    return _slash_to_frac(answer)


def math_equiv_score(text: str, gold: str) -> float:
    """1.0 if the boxed answer and ``gold`` are equal after :func:`hendrycks_normalise` (as raw strings where it
    fails), else 0.0."""
    answer = math_boxed_answer(text)
    if answer is None:
        return 0.0
    try:
        return float(hendrycks_normalise(answer) == hendrycks_normalise(gold))
    except _Unnormalisable:
        return float(answer == gold)


# --- DAPO: the "Answer:" line, Minerva normalisation, +1/-1 ----------------------------------------------------------

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
NO_ANSWER = "[INVALID]"  # what the scorer compares when the completion has no "Answer:" line

# Applied in this order: plain replacements, then removals, then the regular expressions below.
_MINERVA_REPLACEMENTS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_MINERVA_REMOVALS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_MINERVA_REWRITES = (
    (re.compile(r"[^\n]*?\$([^\n]*?)\$[^\n]*"), r"$\1$"),  # keep the first $...$ of a line
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),
)


def minerva_normalise(answer: str) -> str:
    """The DAPO scorer's normalisation (Minerva's): keep what follows the last ``=``, drop spaces, articles, units
    and a list of words, unwrap ``$...$``, ``\\text{}``, ``\\boxed{}``, brace short ``frac``/``sqrt`` arguments, drop
    ``$`` and the commas of a plain integer."""
    answer = answer.split("=")[-1]
    for old, new in _MINERVA_REPLACEMENTS:
        answer = answer.replace(old, new)
    for word in _MINERVA_REMOVALS:
        answer = answer.replace(word, "")
    for pattern, replacement in _MINERVA_REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def dapo_answer_line(text: str) -> str:
    """What follows the last ``Answer:`` (any case) in the last 300 characters, to the end of its line;
    :data:`NO_ANSWER` if there is none."""
    found = _ANSWER_LINE.findall(text[-TAIL_CHARS:])
    return found[-1] if found else NO_ANSWER


def dapo_answer_score(text: str, gold: str) -> float:
    """1.0 if the ``Answer:`` line equals ``gold`` after :func:`minerva_normalise`, else -1.0."""
    return 1.0 if minerva_normalise(dapo_answer_line(text)) == minerva_normalise(gold) else -1.0


# --- routing by data source, as verl's default_compute_score ---------------------------------------------------------


@dataclass(frozen=True)
class Grader:
    """A scorer and what it reads as the answer (for the completions table)."""

    score: Callable[[str, str], float | None]  # None: unscorable (math-verify only)
    answer: Callable[[str], str | None]


GSM8K_STRICT = Grader(gsm8k_strict_score, gsm8k_strict_answer)
MATH_EQUIV = Grader(math_equiv_score, math_boxed_answer)
DAPO_ANSWER = Grader(dapo_answer_score, dapo_answer_line)

# The sources our adapters write (riskpo_trl.data: each dataset's Hub id) and verl's own names for the same data.
GRADERS_BY_SOURCE: dict[str, Grader] = {
    "openai/gsm8k": GSM8K_STRICT,
    "DigitalLearningGmbH/MATH-lighteval": MATH_EQUIV,
    "lighteval/MATH": MATH_EQUIV,
    "BytedTsinghua-SIA/DAPO-Math-17k": DAPO_ANSWER,
    "math_dapo": DAPO_ANSWER,
}


def grader_for_source(source: str) -> Grader | None:
    """The grader verl's ``default_compute_score`` uses for rows of ``source`` (``aime*`` rows: the DAPO one), or
    None for a source it does not grade with these three."""
    if source in GRADERS_BY_SOURCE:
        return GRADERS_BY_SOURCE[source]
    return DAPO_ANSWER if source.startswith("aime") else None
