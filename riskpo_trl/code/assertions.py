"""Assert-style check code, split so that the sandbox only computes values and the trainer decides pass or fail.

Check code (Archer's ``{"functional": ...}`` ground truths, HumanEval-style ``check(candidate)``) calls the program's
functions, so it has to run in the program's interpreter, where the program can rewrite anything: the runner, its
report, ``__eq__`` of the values it returns. So the check is never *decided* there. `instrument_assertions` rewrites
every ``assert`` into a call that only records the values the assertion looks at, as plain JSON built from exact
builtin types (an object with its own ``__eq__`` is refused), and keeps the literal expected values out of the code
the sandbox sees. `assertions_pass` then decides in the trainer's process. A program that forges its report can
therefore only claim values it could have returned anyway; see docs/code_and_multimodal.md for what remains.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any

from . import bounded_json
from ._harness import PROBE_NAME, plain_value

_COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
                ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<", "in": "not in", "not in": "in",
            "is": "is not", "is not": "is", "truthy": "falsy", "falsy": "truthy"}
_SINGLETONS = (None, True, False)
MAX_OBSERVED_CHARS = 16 * 1024 * 1024  # a returned value or assertion record beyond this fails (none real comes close)


@dataclass(frozen=True)
class Probe:
    """One checked condition: ``left op right`` (``right`` unused for "truthy"/"falsy").

    A side given here (``*_known``) is a literal of the check code, kept out of the sandbox; the other sides are
    computed there and reported.
    """

    op: str
    left: Any = None
    right: Any = None
    left_known: bool = False
    right_known: bool = False


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, json.loads(json.dumps(plain_value(ast.literal_eval(node))))
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False, None


class _Instrumenter(ast.NodeTransformer):
    def __init__(self):
        self.probes: list[Probe] = []

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        return [ast.copy_location(ast.Expr(call), node) for call in self._probe_calls(node.test, negate=False)]

    def _probe_calls(self, test: ast.expr, negate: bool) -> list[ast.Call]:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._probe_calls(test.operand, not negate)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and not negate:
            return [call for value in test.values for call in self._probe_calls(value, negate)]
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE_OPS:
            op = _COMPARE_OPS[type(test.ops[0])]
            (left_known, left), (right_known, right) = _literal(test.left), _literal(test.comparators[0])
            identity_ok = (left_known and left in _SINGLETONS) or (right_known and right in _SINGLETONS)
            if op not in ("is", "is not") or identity_ok:
                probe = Probe(_NEGATED[op] if negate else op, left, right, left_known, right_known)
                sides = [ast.Constant(None) if left_known else test.left,
                         ast.Constant(None) if right_known else test.comparators[0]]
                return [self._call(probe, sides)]
        return [self._call(Probe("falsy" if negate else "truthy"), [test, ast.Constant(None)])]

    def _call(self, probe: Probe, sides: list[ast.expr]) -> ast.Call:
        self.probes.append(probe)
        index = ast.Constant(len(self.probes) - 1)
        return ast.Call(ast.Name(PROBE_NAME, ast.Load()), [index, ast.Tuple(sides, ast.Load())], [])


def instrument_assertions(test_code: str) -> tuple[str, list[Probe]]:
    """The check code with each ``assert`` replaced by a probe call, and the probes in order.

    ``assert a and b`` is split into its parts; ``assert not x`` negates. Raises ValueError for code that does not parse.
    """
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"assert-style test code does not parse: {exc}") from exc
    instrumenter = _Instrumenter()
    tree = ast.fix_missing_locations(instrumenter.visit(tree))
    return ast.unparse(tree), instrumenter.probes


def assertions_pass(observed: str, probes: list[Probe]) -> bool:
    """Whether the sandbox's probe records (JSON ``[[index, [left, right]], ...]``) satisfy every probe.

    Every probe must have been reached at least once (a program cannot pass by skipping the check), and every record
    must hold.
    """
    try:
        records = bounded_json.loads(observed, max_bytes=MAX_OBSERVED_CHARS)
    except ValueError:
        return False
    if not isinstance(records, list):
        return False
    reached = set()
    for record in records:
        if not (isinstance(record, list) and len(record) == 2 and type(record[0]) is int
                and 0 <= record[0] < len(probes) and isinstance(record[1], list) and len(record[1]) == 2):
            return False
        probe = probes[record[0]]
        left = probe.left if probe.left_known else record[1][0]
        right = probe.right if probe.right_known else record[1][1]
        if not _holds(probe.op, left, right):
            return False
        reached.add(record[0])
    return len(reached) == len(probes)


def _holds(op: str, left, right) -> bool:
    try:
        if op in ("truthy", "falsy"):
            return _truthy(left) == (op == "truthy")
        if op in ("==", "is"):
            return values_equal(left, right)
        if op in ("!=", "is not"):
            return not values_equal(left, right)
        if op in ("in", "not in"):
            container = _elements(right)
            found = any(values_equal(left, item) for item in container) if isinstance(container, list) \
                else left in container
            return found == (op == "in")
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]
    except (TypeError, ValueError, OverflowError, RecursionError):  # e.g. a list against a number: it would raise
        return False


def _is_set(value) -> bool:
    return isinstance(value, dict) and list(value) == ["__set__"]


def _elements(value):
    """What ``in`` looks through: list/set items, dict keys, or the string itself."""
    if _is_set(value):
        return value["__set__"]
    if isinstance(value, dict):
        return list(value)
    return value


def _truthy(value) -> bool:
    return bool(value["__set__"]) if _is_set(value) else bool(value)


def values_equal(got, want) -> bool:
    """JSON values equal, floats within 1e-6 relative or absolute tolerance; int/float compared numerically.

    Never raises on numbers: ints too large for a float (``10**400``) compare exactly, NaN equals NaN and an
    infinity only itself.
    """
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return _numbers_equal(got, want)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(values_equal(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(values_equal(got[k], want[k]) for k in want)
    return got == want


def _numbers_equal(got: int | float, want: int | float) -> bool:
    if got == want:  # exact, also for huge ints and int/float mixes (Python compares those exactly)
        return True
    if isinstance(got, int) and isinstance(want, int):
        return False
    try:
        got, want = float(got), float(want)
    except OverflowError:  # an int beyond float range is not within tolerance of any finite float
        return False
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
