"""The trainer's side of an assert-style check: evaluate a probe expression over the values the sandbox reported.

`riskpo_trl.code.assertions` cuts each assertion into leaves (evaluated in the sandbox) and an expression over them;
`evaluate` runs that expression here with Python's semantics, on a fixed set of operations: literals, comparisons
(``==`` through `values_equal`), ``and``/``or``/``not``, arithmetic, indexing, and the builtins in `FUNCTIONS`.
Where Python would raise, evaluation raises `EvaluationFailed` (the assertion fails), and sizes are guarded so that a
reported value cannot make the trainer build ``2 ** 10 ** 9``.
"""

from __future__ import annotations

import ast
import collections
import math
import operator
from typing import Any

from .values import Opaque, Raised, _hashable, values_equal

LEAF_PREFIX = "__riskpo_leaf_"  # a probe expression names its i-th leaf LEAF_PREFIX + str(i)
_MAX_SIZE = 1 << 20  # elements or bits a value computed here may reach


def dotted_name(node: ast.expr) -> str | None:
    """``len`` or ``math.isclose`` for a name or a one-level attribute, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class EvaluationFailed(Exception):
    """The assertion does not hold: a comparison is false, or evaluating it would have raised in Python."""


def hashable_set(items=()) -> frozenset:
    return frozenset(_hashable(item) for item in items)


def _bounded_range(*args) -> range:
    span = range(*args)
    if len(span) > _MAX_SIZE:
        raise EvaluationFailed("range too long")
    return span


def _isinstance(value, kinds) -> bool:
    """``isinstance`` over reported values: lists and tuples are one kind (tuples arrive as lists), and so are sets."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    wanted: list[type] = []
    for kind in kinds:
        if kind in (list, tuple):
            wanted += [list, tuple]
        elif kind in (hashable_set, set, frozenset):
            wanted += [set, frozenset]
        elif isinstance(kind, type):
            wanted.append(kind)
        else:
            raise EvaluationFailed("isinstance of something that is not a type")
    return isinstance(value, tuple(wanted))


# What the trainer evaluates itself when check code calls these names (and does not bind them).
FUNCTIONS: dict[str, Any] = {
    "abs": abs, "len": len, "sorted": sorted, "min": min, "max": max, "sum": sum, "round": round, "int": int,
    "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple, "set": hashable_set,
    "frozenset": hashable_set, "all": all, "any": any, "reversed": lambda items: list(reversed(items)),
    "range": _bounded_range, "enumerate": lambda items, start=0: list(enumerate(items, start)),
    "zip": lambda *items: list(zip(*items)), "Counter": collections.Counter, "isclose": math.isclose,
    "math.isclose": math.isclose, "math.fabs": math.fabs, "math.floor": math.floor, "math.ceil": math.ceil,
    "math.sqrt": math.sqrt, "collections.Counter": collections.Counter, "isinstance": _isinstance, "dict": dict,
    "bytes": bytes,
}
CONSTANT_NAMES = {"inf": math.inf, "nan": math.nan, "math.inf": math.inf, "math.nan": math.nan, "math.pi": math.pi}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def evaluate(node: ast.expr, leaves: list):
    """Evaluate a probe expression over the reported leaf values (raises `EvaluationFailed` where Python would raise)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id.startswith(LEAF_PREFIX):
            value = leaves[int(node.id[len(LEAF_PREFIX):])]
            if isinstance(value, Raised):
                raise EvaluationFailed(f"raised {value.exception}")
            return value
        return FUNCTIONS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [evaluate(item, leaves) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Set):
        return _call(hashable_set, [[evaluate(item, leaves) for item in node.elts]], {})
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise EvaluationFailed("dict unpacking")
        return _call(lambda pairs: {_hashable(k): v for k, v in pairs},
                     [[(evaluate(k, leaves), evaluate(v, leaves)) for k, v in zip(node.keys, node.values)]], {})
    if isinstance(node, ast.BoolOp):
        result = None
        for value in node.values:
            result = evaluate(value, leaves)
            if truth(result) == isinstance(node.op, ast.Or):
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        operand = evaluate(node.operand, leaves)
        if isinstance(node.op, ast.Not):
            return not truth(operand)
        return _call(_UNARY[type(node.op)], [operand], {})
    if isinstance(node, ast.BinOp):
        return _binary(node.op, evaluate(node.left, leaves), evaluate(node.right, leaves))
    if isinstance(node, ast.Compare):
        return _compare(node, leaves)
    if isinstance(node, ast.IfExp):
        return evaluate(node.body if truth(evaluate(node.test, leaves)) else node.orelse, leaves)
    if isinstance(node, ast.Subscript):
        container = evaluate(node.value, leaves)
        index = evaluate(node.slice, leaves)
        if isinstance(container, dict):
            index = _hashable(index)
        return _call(operator.getitem, [container, index], {})
    if isinstance(node, ast.Slice):
        parts = [None if part is None else evaluate(part, leaves) for part in (node.lower, node.upper, node.step)]
        return slice(*parts)
    if isinstance(node, ast.Call):
        function = FUNCTIONS[dotted_name(node.func)]
        args = [evaluate(arg, leaves) for arg in node.args]
        keywords = {keyword.arg: evaluate(keyword.value, leaves) for keyword in node.keywords}
        return _call(function, args, keywords)
    raise EvaluationFailed(f"cannot evaluate {type(node).__name__}")


def _opaque(*values) -> bool:
    return any(isinstance(value, (Opaque, Raised)) for value in values)


def _call(function, args: list, keywords: dict):
    if _opaque(*args, *keywords.values()):
        raise EvaluationFailed("an object of the program's own type")
    try:
        return function(*args, **keywords)
    except EvaluationFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Python would raise fails the assertion
        raise EvaluationFailed(f"{type(exc).__name__}: {exc}"[:200]) from None


def _size(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length()
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def _binary(op: ast.operator, left, right):
    if isinstance(op, ast.Pow) and isinstance(right, int) and isinstance(left, int) and (
            right > 10_000 or _size(left) * max(right, 0) > _MAX_SIZE):
        raise EvaluationFailed("power too large")
    if isinstance(op, ast.LShift) and isinstance(right, int) and right > _MAX_SIZE:
        raise EvaluationFailed("shift too large")
    if isinstance(op, ast.Mult) and max(_size(left), 1) * max(_size(right), 1) > _MAX_SIZE * 64 and (
            not (isinstance(left, int) and isinstance(right, int))):
        raise EvaluationFailed("product too large")
    return _call(_BINARY[type(op)], [left, right], {})


def truth(value) -> bool:
    if _opaque(value):
        raise EvaluationFailed("the truth of an object of the program's own type")
    return bool(value)


def _compare(node: ast.Compare, leaves: list) -> bool:
    left = evaluate(node.left, leaves)
    left_known = _leaf_free_expression(node.left)
    for op, comparator in zip(node.ops, node.comparators):
        right = evaluate(comparator, leaves)
        right_known = _leaf_free_expression(comparator)
        got, want = (right, left) if left_known and not right_known else (left, right)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            holds = values_equal(got, want) == isinstance(op, ast.Eq)
        elif isinstance(op, (ast.Is, ast.IsNot)):
            holds = (left is right) == isinstance(op, ast.Is)
        elif isinstance(op, (ast.In, ast.NotIn)):
            holds = _contains_value(right, left) == isinstance(op, ast.In)
        else:
            if _opaque(left, right):
                return False
            try:
                holds = bool(_ORDER[type(op)](left, right))
            except (TypeError, ValueError, OverflowError):
                return False
        if not holds:
            return False
        left, left_known = right, right_known
    return True


def _contains_value(container, item) -> bool:
    if _opaque(container, item):
        return False
    if isinstance(container, (str, bytes)):
        return type(item) is type(container) and item in container
    if isinstance(container, (dict, set, frozenset)):
        try:
            return _hashable(item) in container
        except TypeError:
            return False
    if isinstance(container, (list, tuple)):
        return any(values_equal(item, element) for element in container)
    return False


def _leaf_free_expression(node: ast.expr) -> bool:
    return not any(isinstance(sub, ast.Name) and sub.id.startswith(LEAF_PREFIX) for sub in ast.walk(node))
