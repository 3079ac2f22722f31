"""A normalised test specification for code problems, and how observed outputs are judged against it.

Every dataset adapter turns its problem's tests into a `TestSpec` stored as a JSON string in the dataset's ``tests``
column; the reward parses it back. Expected outputs never enter the sandbox, which only ever sees inputs: a judge
process (`riskpo_trl.code.judge`) compares what the sandbox reported with them (`TestSpec.passes`). They also bound
what is read back from the sandbox (`TestSpec.output_caps`): an honest output is about the size of the expected one,
so a report far beyond that is refused unread instead of parsed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from . import bounded_json
from .assertions import MAX_OBSERVED_CHARS, assertions_pass, instrument_assertions
from .report import TEST_STYLES
from .stdout_compare import stdout_matches
from .values import decode_value, values_equal

# Output caps: stdout may differ from the expected text in whitespace only; a returned value's JSON may be longer than
# the expected JSON (a float's repr, ", " separators); assertion records hold the leaf values the check code computes.
CAP_MARGIN = 4096
STDOUT_CAP_FACTOR = 4
JSON_CAP_FACTOR = 8
ASSERT_CAP_BASE = 1 << 20
ASSERT_CAP_FACTOR = 64


@dataclass(frozen=True)
class TestSpec:
    """Tests of one problem, all in one style (see `Sandbox.run`).

    Attributes:
        style: "stdin" (stdin text in, stdout text out), "functional" (JSON argument lines in, JSON return value out,
                calling ``fn_name``) or "assert" (each input is test code run after the program; outputs are ""). Assert
            code is split first (`riskpo_trl.code.assertions`): the sandbox reports the values of the parts that
            need the program and `passes` evaluates the rest, so the program cannot forge a pass. Check code the
            trainer cannot judge that way is refused here (`UndecidableTestError`, a ValueError).
        inputs: one entry per test.
        outputs: the expected output of each test.
        fn_name: function or ``Solution`` method name of "functional" tests.
    """

    __test__ = False  # not a pytest test class, despite the name

    style: str
    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None

    def __post_init__(self):
        if self.style not in TEST_STYLES:
            raise ValueError(f"TestSpec.style={self.style!r} is unknown; choose one of {TEST_STYLES}.")
        if len(self.inputs) != len(self.outputs) or not self.inputs:
            raise ValueError(
                f"TestSpec needs one expected output per input and at least one test; got {len(self.inputs)} inputs "
                f"and {len(self.outputs)} outputs."
            )
        if self.style == "functional" and not self.fn_name:
            raise ValueError("A 'functional' TestSpec needs fn_name: the function or Solution method to call.")
        if not all(isinstance(x, str) for x in [*self.inputs, *self.outputs]):
            raise ValueError("TestSpec inputs and outputs must be strings (JSON text for 'functional' tests).")
        if self.style == "assert":
            for code in self.inputs:
                instrument_assertions(code)  # raises for code that does not parse or that cannot be judged

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TestSpec:
        """The spec of a dataset cell; ValueError for any text that is not one (JSON nested deeper than
        `bounded_json.MAX_DEPTH` included: plain ``json.loads`` would raise RecursionError for it)."""
        data = bounded_json.loads(text, max_bytes=len(text))  # any size: the nesting is what is bounded
        if not isinstance(data, dict):
            raise ValueError(f"A TestSpec JSON must be an object, got {type(data).__name__}.")
        return cls(
            style=data.get("style"),
            inputs=list(data.get("inputs") or []),
            outputs=list(data.get("outputs") or []),
            fn_name=data.get("fn_name"),
        )

    def sandbox_inputs(self) -> list[str]:
        """What the sandbox runs the program on: the inputs, with assert code instrumented."""
        if self.style != "assert":
            return list(self.inputs)
        return [instrument_assertions(code).sandbox_code for code in self.inputs]

    def output_caps(self) -> list[int]:
        """The most bytes each test's output may take in the sandbox's report: a multiple of the expected output (or,
        for assert tests, of the check code) plus a margin."""
        if self.style == "assert":
            return [ASSERT_CAP_BASE + ASSERT_CAP_FACTOR * len(code.encode()) for code in self.inputs]
        factor = STDOUT_CAP_FACTOR if self.style == "stdin" else JSON_CAP_FACTOR
        return [factor * len(expected.encode()) + CAP_MARGIN for expected in self.outputs]

    def passes(self, observed: list[str]) -> bool:
        """Whether the observed outputs (one per test, in order) match every expected output. Runs in the judge
        process (`riskpo_trl.code.judge`), never in the trainer: the observed outputs are the program's."""
        return self.first_failure(observed) is None

    def first_failure(self, observed: list[str]) -> int | None:
        """The index of the first test whose observed output does not match (``len(observed)`` when outputs are
        missing), or None when all pass."""
        if len(observed) != len(self.outputs):
            return min(len(observed), len(self.outputs))
        for index, (got, want) in enumerate(zip(observed, self.outputs)):
            if self.style == "assert":
                ok = assertions_pass(got, instrument_assertions(self.inputs[index]))
            elif self.style == "functional":
                ok = _functional_match(got, want)
            else:
                ok = stdout_matches(got, want)
            if not ok:
                return index
        return None


def _functional_match(observed: str, expected: str) -> bool:
    try:
        got = bounded_json.loads(observed, max_bytes=MAX_OBSERVED_CHARS)  # program output: size and depth capped
        return values_equal(decode_value(got), bounded_json.loads(expected, max_bytes=len(expected) + 1))
    except (ValueError, RecursionError):
        return False
