"""The judge's side of an assert-style check: evaluate a probe expression over the values the sandbox reported.

`riskpo_trl.code.assertions` cuts each assertion into leaves (evaluated in the sandbox) and an expression over them;
`evaluate` runs that expression here with Python's semantics, on a fixed set of operations: literals, comparisons
(``==`` through `values_equal`), ``and``/``or``/``not``, arithmetic, indexing, and the builtins in `FUNCTIONS`.
Where Python would raise, evaluation raises `EvaluationFailed` (the assertion fails).

Every operation is bounded by the *values* it works on, not by how they are written, because the same evaluator folds
dataset check code at load time (in the trainer) and evaluates probes over program values (in the judge process):
results of ``*``, ``**`` and ``<<`` are size-checked from their operands' values before they are computed (``'ab' *
10**9`` and ``(10**5000) ** 10**5`` are refused unbuilt), ``%`` formatting of strings is not evaluated at all, sets,
dict keys and ``Counter`` refuse many numbers beyond 2**61 (which can be made to share one hash and turn every insert
into a scan), and one evaluation has a budget of elements touched (`work_budget`) so that a long chain of individually
bounded steps is bounded too.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import math
import operator
import threading
from typing import Any

from .values import Opaque, Raised, _hashable, int_from_decimal, int_to_decimal, values_equal

LEAF_PREFIX = "__riskpo_leaf_"  # a probe expression names its i-th leaf LEAF_PREFIX + str(i)
BIG_INT = "__riskpo_int__"  # check code's integer literals beyond the int/str digit limit, spelled as calls of this
_MAX_SIZE = 1 << 20  # elements, characters or bits a computed value may reach
WORK_BUDGET = 20_000_000  # elements or machine words one `work_budget` may touch
_MAX_HASH_COLLIDERS = 256  # numbers beyond 2**61 a hashed collection may hold
_HASH_MODULUS_BITS = 61  # CPython hashes numbers modulo 2**61 - 1


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
        kind = {_int_of: int, _str_of: str}.get(kind, kind)
        if kind in (list, tuple):
            wanted += [list, tuple]
        elif kind in (hashable_set, set, frozenset):
            wanted += [set, frozenset]
        elif isinstance(kind, type):
            wanted.append(kind)
        else:
            raise EvaluationFailed("isinstance of something that is not a type")
    return isinstance(value, tuple(wanted))


def _round(number, ndigits=None):
    if _int(ndigits) and abs(ndigits) > 10_000:  # round(5, -10**9) would compute 10 ** 10**9
        raise EvaluationFailed("round to too many digits")
    return round(number) if ndigits is None else round(number, ndigits)


def _bytes(*args):
    if args and _int(args[0]) and args[0] > _MAX_SIZE:
        raise EvaluationFailed("bytes too long")
    return bytes(*args)


def _int_of(value=0, *args):
    """``int``, also for decimal text beyond the int/str digit limit (converted in chunks below it)."""
    if isinstance(value, str) and not args and len(value) > 4000:
        text = value.strip()
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("+-")
        if digits.isdigit() and digits.isascii() and len(text) - len(digits) <= 1:
            return int_from_decimal(sign + digits)
    return int(value, *args)


def _str_of(*args):
    """``str``, also for integers beyond the int/str digit limit."""
    if len(args) == 1 and _int(args[0]) and args[0].bit_length() > 13_000:
        return int_to_decimal(args[0])
    return str(*args)


def _dict_of_pairs(pairs):
    return {_hashable(key): value for key, value in pairs}


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What is evaluated outside the sandbox when check code calls these names (and does not bind them).
FUNCTIONS: dict[str, Any] = {
    "abs": abs,
    "len": len,
    "sorted": sorted,
    "min": min,
    "max": max,
    "sum": sum,
    "round": _round,
    "int": _int_of,
    "float": float,
    "str": _str_of,
    "bool": bool,
    "list": list,
    "tuple": tuple,
    "set": hashable_set,
    "frozenset": hashable_set,
    "all": all,
    "any": any,
    "reversed": lambda items: list(reversed(items)),
    "range": _bounded_range,
    "enumerate": lambda items, start=0: list(enumerate(items, start)),
    "zip": lambda *items: list(zip(*items)),
    "Counter": collections.Counter,
    "isclose": math.isclose,
    "math.isclose": math.isclose,
    "math.fabs": math.fabs,
    "math.floor": math.floor,
    "math.ceil": math.ceil,
    "math.sqrt": math.sqrt,
    "collections.Counter": collections.Counter,
    "isinstance": _isinstance,
    "dict": dict,
    "bytes": _bytes,
    "math.pow": math.pow,
    BIG_INT: int_from_decimal,
}
CONSTANT_NAMES = {"inf": math.inf, "nan": math.nan, "math.inf": math.inf, "math.nan": math.nan, "math.pi": math.pi}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def evaluate(node: ast.expr, leaves: list):
    """Evaluate a probe expression over the reported leaf values (raises `EvaluationFailed` where Python would raise)."""
    charge(1)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id.startswith(LEAF_PREFIX):
            value = leaves[int(node.id[len(LEAF_PREFIX) :])]
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
        pairs = [(evaluate(key, leaves), evaluate(value, leaves)) for key, value in zip(node.keys, node.values)]
        return _call(_dict_of_pairs, [pairs], {})
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


class _Work(threading.local):
    remaining: int | None = None


_work = _Work()


@contextlib.contextmanager
def work_budget(units: int = WORK_BUDGET):
    """Bound the elements and machine words the evaluations inside touch, together (per thread)."""
    outer, _work.remaining = _work.remaining, units
    try:
        yield
    finally:
        _work.remaining = outer


def charge(units: int) -> None:
    """Spend ``units`` of the current `work_budget` (none outside one); raise `EvaluationFailed` beyond it."""
    if _work.remaining is not None:
        _work.remaining -= units
        if _work.remaining < 0:
            raise EvaluationFailed("the check needs more work than its budget")


def _measure(value, colliders: list[int], limit: int) -> int:
    """Elements, characters and machine words of ``value`` and everything in it (walked iteratively, stopping at
    ``limit``); counts numbers beyond 2**61 into ``colliders[0]``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        total += 1
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int):
            bits = item.bit_length()
            total += bits >> 6
            colliders[0] += bits > _HASH_MODULUS_BITS
        elif isinstance(item, float):
            colliders[0] += math.isfinite(item) and abs(item) >= 2.0**_HASH_MODULUS_BITS
        elif isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return total


def size_of(value, limit: int = _MAX_SIZE * 16) -> int:
    """Elements, characters and machine words of ``value`` and everything in it, counted up to about ``limit``."""
    return _measure(value, [0], limit)


# Functions (by __name__) that hash the items of their arguments
_HASHING = {"hashable_set", "Counter", "dict", "_dict_of_pairs"}


def _call(function, args: list, keywords: dict):
    if _opaque(*args, *keywords.values()):
        raise EvaluationFailed("an object of the program's own type")
    colliders = [0]
    size = _measure([args, list(keywords.values())], colliders, _MAX_SIZE * 16)
    if size > _MAX_SIZE * 16:
        raise EvaluationFailed("arguments too large to evaluate")
    charge(size)
    if getattr(function, "__name__", "") in _HASHING and colliders[0] > _MAX_HASH_COLLIDERS:
        raise EvaluationFailed("too many numbers beyond 2**61 to hash")
    try:
        return function(*args, **keywords)
    except EvaluationFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever Python would raise fails the assertion
        raise EvaluationFailed(f"{type(exc).__name__}: {exc}"[:200]) from None


def _length(value) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _binary(op: ast.operator, left, right):
    """``left <op> right``, refused unbuilt when its result would be over `_MAX_SIZE` (judged from the values)."""
    if isinstance(op, ast.Mult):
        if _int(left) and _int(right) and left.bit_length() + right.bit_length() > _MAX_SIZE:
            raise EvaluationFailed("product too large")
        for sequence, count in ((left, right), (right, left)):
            if _length(sequence) is not None and _int(count) and _length(sequence) * max(count, 0) > _MAX_SIZE:
                raise EvaluationFailed("repetition too large")
    elif (
        isinstance(op, ast.Pow)
        and _int(left)
        and _int(right)
        and right > 0
        and abs(left) > 1
        and (right > _MAX_SIZE or left.bit_length() * right > _MAX_SIZE)
    ):
        raise EvaluationFailed("power too large")
    elif (
        isinstance(op, ast.LShift)
        and _int(left)
        and _int(right)
        and left
        and (right > _MAX_SIZE or left.bit_length() + right > _MAX_SIZE)
    ):
        raise EvaluationFailed("shift too large")
    elif isinstance(op, ast.Mod) and isinstance(left, (str, bytes)):
        raise EvaluationFailed("%-formatting is not evaluated")
    if _int(left) and _int(right):  # big-int products and divisions cost about words x words, not words
        words = (left.bit_length() >> 6) + 1, (right.bit_length() >> 6) + 1
        if isinstance(op, (ast.Mult, ast.FloorDiv, ast.Mod)):
            charge(words[0] * words[1] >> 4)
        elif isinstance(op, ast.Pow) and right > 0:
            charge(((words[0] * right) >> 4) * words[0])
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
