"""Assert-style check code, split so that the sandbox only computes the program's values and a judge decides.

Check code (Archer's ``{"functional": ...}`` ground truths, HumanEval-style ``check(candidate)``) calls the program's
functions, so part of it has to run in the program's interpreter, where the program can rewrite anything: the runner,
its report, ``__eq__`` of what it returns, any variable of the check code. So no verdict is decided there, and no
expected value is put there. `instrument_assertions` (run in the trainer when the tests are parsed, on the check
code only) cuts every ``assert`` into

* **leaves**: the sub-expressions that need the program (``candidate(x)``, ``Solution().f(1)``, ``res.val``) or other
  names of the check code; the sandbox evaluates them and reports their values as JSON of builtin values;
* the **rest**, evaluated by the judge process (`riskpo_trl.code.judge`) with a small interpreter over those values
  (`riskpo_trl.code.check_eval`): literals, comparisons, ``and``/``or``/``not``, arithmetic, indexing and a fixed set
  of builtins (`FUNCTIONS`: ``abs``, ``len``, ``sorted``, ``math.isclose``...).

Loops over literal tables (``for x, want in [(2, 4), (3, 9)]``, ``for t in tests: assert f(*t[0]) == t[1]``, dict rows)
are unrolled and ``if`` statements with a condition known here are folded, before the split, and known values the
sandbox code reads are written into it as literals: a row's input part (``t[0]``, ``t[:-1]``, ``tc["input"]``), never
the row. So a loop table's or a ``case = (args, want)``'s expected value stays out of the sandbox, an assertion in a
branch not taken is simply gone, and a ``math.isclose`` tolerance is known here or refused. Every remaining assertion
must be reached exactly once, so a program cannot pass by skipping the check.

A program that forges its report can then only claim leaf values, which is what returning them would have done. That
holds when, in every comparison, one side is known here, or every leaf of both sides derives from the program; and for
a bare truth test (``assert f(x)``) when its leaves derive from the program. Check code that cannot be judged that
way raises `UndecidableTestError`, and the dataset adapters drop and count such rows (docs/code_sandbox.md):
an expected value or tolerance computed in the sandbox (``assert f(x) == brute(x)``, ``assert helper(f(x), 2.5)``);
assertions inside loops over computed values or ``if`` on the program's values, or in functions not called at the
top level; checks that fail other than by such an assertion (``raise``, unittest's ``assertEqual``, ``try``,
``with``, ``while``, exits, an ``if`` on the program's values, a comparison nothing asserts), since the program
decides those; and an expected value the sandbox code would also hold.
"""

from __future__ import annotations

import ast
import builtins
import collections
import copy
import functools
import io
import math
import re
import tokenize
from dataclasses import dataclass
from typing import Any

from . import bounded_json
from ._harness import _PRELUDE, PROBE_NAME
from .check_eval import (
    BIG_INT,
    CONSTANT_NAMES,
    FUNCTIONS,
    LEAF_PREFIX,
    WORK_BUDGET,
    EvaluationFailed,
    charge,
    dotted_name,
    evaluate,
    size_of,
    truth,
    work_budget,
)
from .single_flight import single_flight_cache
from .values import decode_value, int_to_decimal

MAX_OBSERVED_CHARS = 16 * 1024 * 1024  # a returned value or assertion record beyond this fails (none real comes close)
MAX_UNROLLED_ASSERTIONS = 5000  # more (after unrolling loops) is refused as too large to judge
MAX_UNROLLED_STATEMENTS = 20_000  # statements of the check once loops are unrolled: more is refused
MAX_LOOP_ITERATIONS = 2000
MAX_CHECK_CODE_CHARS = 1_000_000  # longer check code is refused unparsed
# What one AST node the split parses or builds costs, in units of the folding `work_budget` (elements the evaluator
# touches): about the same CPU time (some 20 us a node, against some 0.15 us an element; docs/code_sandbox.md).
NODE_COST = 150
JUDGE_WORK_BUDGET = 50 * WORK_BUDGET  # per probe, in the judge process (whose CPU limit bounds it anyway)

_STRUCTURE = (
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.Subscript,
    ast.Slice,
)


class UndecidableTestError(ValueError):
    """Check code whose assertions the trainer cannot judge without trusting the program's report: ``kind`` names
    the construct (what the dataset loaders count), ``detail`` where it is."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@functools.cache
def _prelude_names() -> frozenset[str]:
    """Names the runner's prelude defines before the program (standard library imports only)."""
    namespace: dict[str, Any] = {}
    exec(_PRELUDE, namespace)  # noqa: S102 - the fixed import lines of the runner, no outside input
    return frozenset(namespace)


def _harmless_import(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> bool:
    if isinstance(node, ast.Import):
        return alias.name in ("math", "collections") and alias.asname is None
    return (
        node.module in ("math", "collections")
        and alias.asname is None
        and (alias.name in FUNCTIONS or alias.name in CONSTANT_NAMES)
    )


def _root_name(node: ast.expr) -> str | None:
    """The name a call/attribute/subscript chain starts from (``Solution().f(1).val`` -> ``Solution``)."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _stored_names(nodes) -> list[str]:
    """Every name bound in ``nodes`` (not inside nested function, lambda or class scopes)."""
    found = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(node.name)
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            found += list(node.names) * 2  # never a constant
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.append(node.name)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _contains(nodes, kinds) -> bool:
    return any(isinstance(sub, kinds) for node in nodes for sub in ast.walk(node))


@dataclass(frozen=True)
class Probe:
    """One assertion as the judge evaluates it: ``expression`` with its leaves as ``__riskpo_leaf_<i>`` names."""

    expression: ast.expr
    n_leaves: int
    source: str  # the assertion as written, for messages


@dataclass(frozen=True)
class InstrumentedCheck:
    """Check code for the sandbox (assertions replaced by leaf probes) and the probes the judge evaluates."""

    sandbox_code: str
    probes: tuple[Probe, ...]


class _Scope:
    """Names of one scope (the module, or a check function) as the split sees them."""

    def __init__(
        self,
        body: list[ast.stmt],
        splitter: _Splitter,
        parent: _Scope | None = None,
        params: list[str] = (),
        program_params: set[str] = frozenset(),
    ):
        self.parent = parent
        self.splitter = splitter
        counts = collections.Counter(_stored_names(body) + list(params) * 2)
        self.assigned_once = {name for name, count in counts.items() if count == 1}
        self.local = set(counts)
        self.constants: dict[str, Any] = {}
        self.program: set[str] = set(program_params)  # names whose value derives from the program
        self.outputs: set[str] = set()  # those of them that hold a result, not a function or a Solution object

    def bind_constant(self, name: str, value) -> bool:
        """Treat ``name`` as the known ``value`` unless an earlier pass found that the sandbox reads it while it is
        mutable (the program may change it): then it stays a sandbox name."""
        if name in self.splitter.demoted:
            self.constants.pop(name, None)
            return False
        self.constants[name] = value
        if isinstance(value, (list, dict, set, bytearray)):
            self.splitter.mutable_constants.add(name)
        return True

    def constant(self, name: str) -> tuple[bool, Any]:
        if name in self.constants:
            return True, self.constants[name]
        if name in self.local or self.parent is None:
            if self.parent is None and name in CONSTANT_NAMES and name not in self.splitter.bound_anywhere:
                return True, CONSTANT_NAMES[name]
            return False, None
        return self.parent.constant(name)

    def is_output(self, name: str) -> bool:
        if name in self.outputs or name in self.splitter.demoted:
            return True
        if name in self.local or self.parent is None:
            return False
        return self.parent.is_output(name)

    def is_program(self, name: str) -> bool:
        if name in self.program or (name in self.splitter.demoted and name in self.splitter.passed_to_program):
            return True
        if name in self.local or self.parent is None:
            return False
        return self.parent.is_program(name)


class _Splitter:
    """Cuts check code into sandbox code and trainer-side probes (see the module docstring)."""

    def __init__(self, tree: ast.Module, demoted: set[str]):
        self.tree = tree
        self.demoted = demoted  # names found to be mutable constants that the sandbox reads (see `instrument`)
        self.mutable_constants: set[str] = set()
        stored = collections.Counter(_stored_names(tree.body))
        for node in ast.walk(tree):  # parameters and names bound in any nested scope also shadow builtins
            if isinstance(node, ast.arg):
                stored[node.arg] += 2
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                stored.update(_stored_names(node.body))
        # `import math` or `from math import isclose` keep the names meaning what this module evaluates
        harmless = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
            if _harmless_import(node, alias)
        }
        self.bound_anywhere = {name for name in stored if not (name in harmless and stored[name] == 1)}
        known = self.bound_anywhere | set(dir(builtins)) | _prelude_names() | {BIG_INT}
        self.program_refs = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known
        }
        parameters = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
        self.passed_to_program = {  # names given to a call into the program (or to a parameter, maybe the program)
            name.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _root_name(node.func) in self.program_refs | parameters
            for argument in [*node.args, *(keyword.value for keyword in node.keywords)]
            for name in ast.walk(argument)
            if isinstance(name, ast.Name)
        }
        self.probes: list[Probe] = []
        self.statements = 0  # statements built so far (`_built`)
        self.expected_names: set[str] = set()  # constants the trainer's side of an assertion reads
        self._trainer_reads: set[str] = set()  # constants the last `split` folded in

    # --- expressions ---------------------------------------------------------------------------------------------

    def _function(self, node: ast.expr, scope: _Scope) -> Any | None:
        name = dotted_name(node)
        if name is None or name.split(".")[0] in self.bound_anywhere:
            return None
        return FUNCTIONS.get(name)

    def _structural(self, node: ast.expr, scope: _Scope) -> bool:
        """Whether ``node`` is evaluated outside the sandbox (its children may still be leaves)."""
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return not any(isinstance(item, ast.Starred) for item in node.elts)
        if isinstance(node, ast.Dict):
            return None not in node.keys
        if isinstance(node, _STRUCTURE):
            return True
        if isinstance(node, ast.Name):
            return scope.constant(node.id)[0] or (self._function(node, scope) is not None)
        if isinstance(node, ast.Attribute):
            return dotted_name(node) in CONSTANT_NAMES and node.value.id not in self.bound_anywhere
        if isinstance(node, ast.Call):
            return (
                self._function(node.func, scope) is not None
                and not any(isinstance(arg, (ast.Starred, ast.Lambda)) for arg in node.args)
                and all(keyword.arg not in (None, "key") for keyword in node.keywords)
            )
        return False

    def split(self, node: ast.expr, scope: _Scope, leaves: list[ast.expr]) -> ast.expr:
        """A copy of ``node`` for the trainer, with each leaf moved to ``leaves`` and replaced by a placeholder."""
        if not self._structural(node, scope):
            leaves.append(node)
            return ast.Name(f"{LEAF_PREFIX}{len(leaves) - 1}", ast.Load())
        if isinstance(node, ast.Name):
            known, value = scope.constant(node.id)
            if known:
                self._trainer_reads.add(node.id)
            return ast.Constant(value) if known else node
        if isinstance(node, ast.Attribute):
            return ast.Constant(CONSTANT_NAMES[dotted_name(node)])
        if isinstance(node, ast.Call):
            return ast.Call(
                node.func,
                [self.split(arg, scope, leaves) for arg in node.args],
                [ast.keyword(k.arg, self.split(k.value, scope, leaves)) for k in node.keywords],
            )
        new = copy.copy(node)
        for field_name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr) and not isinstance(value, ast.expr_context):
                setattr(new, field_name, self.split(value, scope, leaves))
            elif isinstance(value, list):
                setattr(
                    new,
                    field_name,
                    [self.split(item, scope, leaves) if isinstance(item, ast.expr) else item for item in value],
                )
        return new

    def leaf_free(self, node: ast.expr, scope: _Scope) -> bool:
        leaves: list[ast.expr] = []
        self.split(node, scope, leaves)
        return not leaves

    def program_derived(self, node: ast.expr, scope: _Scope) -> bool:
        """Whether ``node``'s value is something the program could have produced anyway: it uses a program name, and
        outside the arguments of calls into the program it holds no literal and no other name of the check code."""
        uses_program, inner = False, set()
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Call) and self._program_rooted(current.func, scope):
                uses_program = True
                stack.append(current.func)  # its arguments are inputs: anything goes there
                continue
            if isinstance(current, ast.Constant):
                return False
            if isinstance(current, (ast.Lambda, ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                inner.update(_stored_names([current]))
                inner.update(arg.arg for arg in ast.walk(current) if isinstance(arg, ast.arg))
            if isinstance(current, ast.Name) and current.id not in inner:
                if scope.is_program(current.id):
                    uses_program = True
                elif current.id in self.bound_anywhere:  # another name of the check code
                    return False
            stack.extend(ast.iter_child_nodes(current))
        return uses_program

    def _program_rooted(self, node: ast.expr, scope: _Scope) -> bool:
        """Whether calling ``node`` calls into the program (``candidate``, ``Solution().f``, ``sol.f``): then the call's
        arguments are the program's inputs. A method of a result (``f(x).startswith("a")``) is not: its arguments may
        be expected values."""
        while isinstance(node, (ast.Attribute, ast.Call)):
            if isinstance(node, ast.Call) and (node.args or node.keywords):
                return False
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and scope.is_program(node.id) and not scope.is_output(node.id)

    def _check_decidable(self, node: ast.expr, scope: _Scope, truth_context: bool) -> None:
        """Refuse an assertion whose verdict would rest on a value only the sandbox knows (module docstring)."""
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if isinstance(op, (ast.Is, ast.IsNot)) and not any(
                    isinstance(side, ast.Constant) and side.value in (None, True, False) for side in (left, right)
                ):
                    raise UndecidableTestError(
                        "an identity test (`is`) with something other than None, True or False",
                        ast.unparse(node)[:120],
                    )
                self._check_pair(left, right, scope)
            for operand in operands:
                self._check_decidable(operand, scope, truth_context=False)
            return
        if isinstance(node, ast.Call) and self._function(node.func, scope) is math.isclose and len(node.args) >= 2:
            self._check_pair(node.args[0], node.args[1], scope)
            for tolerance in [*node.args[2:], *(keyword.value for keyword in node.keywords)]:
                if not self.leaf_free(tolerance, scope):  # the program could set it (EPS = 1e308)
                    raise UndecidableTestError("a tolerance computed in the sandbox", ast.unparse(tolerance)[:80])
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check_decidable(value, scope, truth_context)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check_decidable(node.operand, scope, truth_context=True)
            return
        if isinstance(node, ast.IfExp):
            self._check_decidable(node.test, scope, truth_context=True)
            self._check_decidable(node.body, scope, truth_context)
            self._check_decidable(node.orelse, scope, truth_context)
            return
        if truth_context:
            leaves: list[ast.expr] = []
            self.split(node, scope, leaves)
            if not all(self.program_derived(leaf, scope) for leaf in leaves):
                raise UndecidableTestError("a truth test computed in the sandbox", ast.unparse(node)[:120])

    def _check_pair(self, left: ast.expr, right: ast.expr, scope: _Scope) -> None:
        if self.leaf_free(left, scope) or self.leaf_free(right, scope):
            return
        leaves: list[ast.expr] = []
        self.split(left, scope, leaves)
        self.split(right, scope, leaves)
        if not all(self.program_derived(leaf, scope) for leaf in leaves):
            raise UndecidableTestError(
                "an expected value computed in the sandbox", f"{ast.unparse(left)[:80]} vs {ast.unparse(right)[:80]}"
            )

    # --- statements ----------------------------------------------------------------------------------------------

    def _built(self, count: int) -> None:
        """Count ``count`` statements of sandbox code built; refuse the check beyond `MAX_UNROLLED_STATEMENTS`."""
        self.statements += count
        if self.statements > MAX_UNROLLED_STATEMENTS:
            raise UndecidableTestError(_TOO_MANY_STATEMENTS, f"over {MAX_UNROLLED_STATEMENTS} built so far")

    def assertion(self, node: ast.Assert, scope: _Scope) -> ast.stmt:
        self._check_decidable(node.test, scope, truth_context=True)
        leaves: list[ast.expr] = []
        self._trainer_reads = set()
        expression = self.split(node.test, scope, leaves)
        self.expected_names |= self._trainer_reads
        leaves = [self.fold(leaf, scope) for leaf in leaves]
        for leaf in leaves:
            if _contains([leaf], (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)):
                raise UndecidableTestError(
                    "a sub-expression that cannot be evaluated on its own", ast.unparse(leaf)[:80]
                )
        self.probes.append(Probe(expression, len(leaves), ast.unparse(node)[:200]))
        if len(self.probes) > MAX_UNROLLED_ASSERTIONS:
            raise UndecidableTestError(f"more than {MAX_UNROLLED_ASSERTIONS} assertions once loops are unrolled")
        thunks = ast.Tuple(
            [ast.Lambda(ast.arguments([], [], None, [], [], None, []), leaf) for leaf in leaves], ast.Load()
        )
        call = ast.Call(ast.Name(PROBE_NAME, ast.Load()), [ast.Constant(len(self.probes) - 1), thunks], [])
        return ast.copy_location(ast.Expr(call), node)

    def block(self, body: list[ast.stmt], scope: _Scope, functions: dict[str, ast.FunctionDef]) -> list[ast.stmt]:
        """The sandbox code of a straight-line block: assertions become probes, literal loops are unrolled, ``if``s on
        known conditions folded, constants bound here only when the sandbox needs them."""
        out: list[ast.stmt] = []
        for statement in body:
            out.extend(self.statement(statement, scope, functions))
        return out

    def statement(self, node: ast.stmt, scope: _Scope, functions: dict[str, ast.FunctionDef]) -> list[ast.stmt]:
        if isinstance(node, ast.Assert):
            self._built(1)
            return [self.assertion(node, scope)]
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            return self._assign(node, node.targets[0].id, scope)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], (ast.Tuple, ast.List))
        ):
            unpacked = self._unpack(node, node.targets[0], scope)
            if unpacked is not None:
                return unpacked
        if isinstance(node, ast.For) and not node.orelse:
            unrolled = self._unroll(node, scope, functions)
            if unrolled is not None:
                return unrolled
        if isinstance(node, ast.If) and self.leaf_free(node.test, scope):
            taken = node.body if self.evaluate_constant(node.test, scope) else node.orelse
            return self.block(taken, scope, functions)
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            self._built(1)
            return [self._function_def(node, scope, functions[node.name])]
        if _contains([node], ast.Assert):
            raise UndecidableTestError(
                "an assertion on a path the trainer cannot know (only straight-line code, loops over literal tables "
                "and ifs on known values are judged)",
                ast.unparse(node).splitlines()[0][:80],
            )
        if isinstance(node, ast.If):
            raise UndecidableTestError(
                "an if on values only the sandbox knows (whatever it does there, the program decides)",
                ast.unparse(node.test)[:80],
            )
        self._built(1)
        return [self.fold(node, scope)]

    def _assign(self, node: ast.Assign, name: str, scope: _Scope) -> list[ast.stmt]:
        self._built(1)
        if name in scope.assigned_once and self.leaf_free(node.value, scope):
            scope.bind_constant(name, self.evaluate_constant(node.value, scope))
            return [node]  # dropped later unless the sandbox reads the name (`_prune`)
        if name in scope.assigned_once and self.program_derived(node.value, scope):
            scope.program.add(name)
            if not self._program_rooted(node.value, scope):  # `sol = Solution()` holds the program, not a result
                scope.outputs.add(name)
        return [self.fold(node, scope)]

    def _unpack(self, node: ast.Assign, target: ast.Tuple | ast.List, scope: _Scope) -> list[ast.stmt] | None:
        """``x, want = t`` of a known ``t``: each name becomes a known value (so ``want`` stays out of the sandbox)."""
        names = [item.id for item in target.elts if isinstance(item, ast.Name)]
        if (
            len(names) != len(target.elts)
            or not set(names) <= scope.assigned_once
            or not self.leaf_free(node.value, scope)
        ):
            return None
        try:
            values = list(self.evaluate_constant(node.value, scope))
        except TypeError:
            values = []
        if len(values) != len(names):
            raise UndecidableTestError("an assignment that does not unpack", ast.unparse(node)[:80])
        self._built(len(names))
        out: list[ast.stmt] = []
        for name, value in zip(names, values):
            scope.bind_constant(name, value)
            assign = ast.Assign([ast.Name(name, ast.Store())], _literal_node(value), lineno=node.lineno)
            assign.riskpo_constant = True  # dropped unless the sandbox reads it (`_prune`)
            out.append(assign)
        return out

    def _unroll(self, node: ast.For, scope: _Scope, functions) -> list[ast.stmt] | None:
        targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
        if not all(isinstance(target, ast.Name) for target in targets) or not self.leaf_free(node.iter, scope):
            return None
        if _contains(node.body, (ast.Break, ast.Continue)) or set(_stored_names(node.body)) & {
            target.id for target in targets
        }:
            return None
        items = list(self.evaluate_constant(node.iter, scope))
        if len(items) > MAX_LOOP_ITERATIONS:
            raise UndecidableTestError(f"a loop of more than {MAX_LOOP_ITERATIONS} iterations", str(len(items)))
        out: list[ast.stmt] = []
        names = [target.id for target in targets]
        body_nodes = sum(1 for statement in node.body for _ in ast.walk(statement))
        before = self.statements
        for index, item in enumerate(items):
            if index == 1:  # one iteration built: refuse now, unbuilt, what all of them would build beyond the cap
                projected = self.statements + (len(items) - 1) * (self.statements - before)
                if projected > MAX_UNROLLED_STATEMENTS:
                    raise UndecidableTestError(_TOO_MANY_STATEMENTS, f"{projected} statements")
            values = [item] if len(names) == 1 else list(item)
            if len(values) != len(names):
                raise UndecidableTestError("a loop item that does not unpack", f"{item!r:.80} into {names}")
            self._built(len(names))
            charge(NODE_COST * body_nodes)  # the copy of the body below, and all that is done with it
            for name, value in zip(names, values):
                scope.bind_constant(name, value)
                assign = ast.Assign([ast.Name(name, ast.Store())], _literal_node(value), lineno=node.lineno)
                assign.riskpo_constant = True  # dropped unless the sandbox reads it (`_prune`)
                out.append(assign)
            out.extend(self.block(copy.deepcopy(node.body), scope, functions))
        for name in names:
            scope.constants.pop(name, None)
        return out

    def _function_def(self, node: ast.FunctionDef, scope: _Scope, call: ast.Call) -> ast.FunctionDef:
        params = [arg.arg for arg in node.args.posonlyargs + node.args.args]
        passed = dict(zip(params, call.args)) | {k.arg: k.value for k in call.keywords if k.arg}
        program = {name for name, value in passed.items() if self.program_derived(value, scope)}
        everything = (
            params
            + [arg.arg for arg in node.args.kwonlyargs]
            + [arg.arg for arg in (node.args.vararg, node.args.kwarg) if arg is not None]
        )
        inner = _Scope(node.body, self, scope, everything, program)
        new = copy.copy(node)
        new.body = self.block(node.body, inner, {}) or [ast.Pass()]
        new.body = _prune(new.body, inner) or [ast.Pass()]
        return new

    def fold(self, node: ast.AST, scope: _Scope) -> ast.AST:
        """``node`` (sandbox code) with the known values it reads written in as literals: subscripts of known rows
        (``t[0]``, ``t[:-1]``, ``tc["input"]``) and names of known immutable values. So a loop table's row, or a
        ``case = (args, want)``, is never bound in the sandbox: only the parts the program is called with are."""
        return _Folder(self, scope).visit(copy.deepcopy(node))

    def evaluate_constant(self, node: ast.expr, scope: _Scope):
        try:
            return evaluate(self.split(node, scope, []), [])
        except EvaluationFailed as exc:
            raise UndecidableTestError(
                "a known value that cannot be evaluated", f"{ast.unparse(node)[:80]}: {exc}"
            ) from exc

    def run(self) -> InstrumentedCheck:
        _refuse_checks_decided_in_the_sandbox(self.tree)
        functions = {}
        for statement in self.tree.body:  # check functions the top level calls in its straight line
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Call)
                and isinstance(statement.value.func, ast.Name)
            ):
                functions.setdefault(statement.value.func.id, statement.value)
        defined = {node.name for node in self.tree.body if isinstance(node, ast.FunctionDef)}
        functions = {name: call for name, call in functions.items() if name in defined}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in functions and _calls_in(self.tree, node.name) > 1:
                raise UndecidableTestError("a check function called more than once or from elsewhere", node.name)
        scope = _Scope(self.tree.body, self)
        scope.program.update(self.program_refs)
        body = _prune(self.block(self.tree.body, scope, functions), scope)
        sandbox_reads = {
            node.id
            for statement in body
            for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        leaked = sorted((sandbox_reads & self.expected_names) - self.demoted)
        if leaked:  # a name an assertion compares with, bound where the program could read it
            raise UndecidableTestError("an expected value the sandbox would also hold", ", ".join(leaked)[:80])
        if not any(probe.n_leaves for probe in self.probes):
            raise UndecidableTestError(
                "check code with no assertion on the program's values: only the runner, which "
                "the program controls, would say that it passed"
            )
        return InstrumentedCheck(ast.unparse(ast.fix_missing_locations(ast.Module(body, []))), tuple(self.probes))


_TOO_MANY_STATEMENTS = f"more than {MAX_UNROLLED_STATEMENTS} statements once loops are unrolled"
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None))
_NEW_SCOPES = (
    ast.Lambda,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)
# Unittest methods (``self.assertEqual``...), exits and checks that fail by raising: each would decide a verdict in
# the sandbox, where the program decides what they see.
_EXIT_CALLS = {"exit", "quit", "sys.exit", "os._exit", "os.abort", "os.kill", "unittest.main"}


def _immutable(value) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(item) for item in value)
    return isinstance(value, _IMMUTABLE)


class _Folder(ast.NodeTransformer):
    """Writes known values into sandbox code (`_Splitter.fold`); leaves nested scopes alone (their names may be
    rebound there)."""

    def __init__(self, splitter: _Splitter, scope: _Scope):
        self.splitter, self.scope = splitter, scope

    def generic_visit(self, node):
        if isinstance(node, _NEW_SCOPES):
            return node
        return super().generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if isinstance(node.ctx, ast.Load):
            known, value = self.scope.constant(node.id)
            if known and _immutable(value):
                return ast.copy_location(_literal_node(value), node)
        return node

    def visit_Subscript(self, node: ast.Subscript):
        if (
            isinstance(node.ctx, ast.Load)
            and isinstance(_root_name(node), str)
            and self.splitter.leaf_free(node, self.scope)
            and self.scope.constant(_root_name(node))[0]
        ):
            return ast.copy_location(_literal_node(self.splitter.evaluate_constant(node, self.scope)), node)
        return self.generic_visit(node)


def _refuse_checks_decided_in_the_sandbox(tree: ast.Module) -> None:
    """Refuse check code that can fail other than by an assertion the trainer judges: whatever decides such a
    failure runs in the sandbox, where the program can make it pass (``if f(5) != 25: raise AssertionError``)."""
    for node in ast.walk(tree):
        reason = None
        if isinstance(node, ast.Raise):
            reason = "a check that fails by raising instead of asserting"
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try), ast.With, ast.AsyncWith)):
            reason = "a check inside try or with (e.g. expecting an exception)"
        elif isinstance(node, ast.While):
            reason = "a while loop (whether and how often it runs is up to the program)"
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0] == "unittest"
            for alias in node.names
        ):
            reason = "a unittest check (its assert methods run in the sandbox)"
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Compare):
            reason = "a comparison whose result nothing checks"
        elif isinstance(node, ast.Call):
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if method.startswith("assert") or method in ("fail", "failUnless", "failIf"):
                reason = "a unittest check (its assert methods run in the sandbox)"
            elif dotted_name(node.func) in _EXIT_CALLS:
                reason = "an exit or kill that decides the check in the sandbox"
            elif dotted_name(node.func) == "print" and _contains(node.args, ast.Compare):
                reason = "a check that is printed, not asserted"
        if reason is not None:
            raise UndecidableTestError(reason, ast.unparse(node).splitlines()[0][:80])


def _calls_in(tree: ast.AST, name: str) -> int:
    return sum(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) for node in ast.walk(tree)
    )


def _literal_node(value) -> ast.expr:
    """An expression that rebuilds ``value`` in the sandbox (for loop variables the sandbox needs), paid for from the
    folding budget before it is built."""
    charge(NODE_COST * size_of(value))
    return _literal(value)


def _literal(value) -> ast.expr:
    if isinstance(value, float) and not math.isfinite(value):
        return ast.parse(f"float({str(value)!r})", mode="eval").body
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = {list: ast.List, tuple: ast.Tuple}.get(type(value))
        elements = [_literal(item) for item in value]
        if kind is not None:
            return kind(elements, ast.Load())
        return ast.Call(ast.Name("set", ast.Load()), [ast.List(elements, ast.Load())], [])
    if isinstance(value, dict):
        return ast.Dict([_literal(k) for k in value], [_literal(v) for v in value.values()])
    if isinstance(value, int) and value.bit_length() > 13_000:  # unparsing it would pass the int/str digit limit
        return ast.Call(ast.Name("int", ast.Load()), [ast.Constant(int_to_decimal(value))], [])
    return ast.Constant(value)


_DIGIT_RUN = re.compile(r"[0-9_]+")  # greedy, no backtracking: one pass over the code


def _spell_out_long_ints(code: str) -> str:
    """``code`` with each integer literal of over 4,000 digits written as ``__riskpo_int__("digits")``: parsing it
    as a literal would pass the interpreter's int/str digit limit (and lifting that limit would lift it for every
    thread); the call is evaluated by a chunked conversion (`riskpo_trl.code.values.int_from_decimal`)."""
    if all(len(run) <= 4000 for run in _DIGIT_RUN.findall(code)):
        return code
    lines = code.splitlines(keepends=True)
    edits = []
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        text = token.string.replace("_", "")
        if token.type == tokenize.NUMBER and len(text) > 4000 and text.isdigit():
            edits.append((token.start, token.end, f"{BIG_INT}({text!r})"))
    for (row, col), (end_row, end_col), replacement in reversed(edits):  # NUMBER tokens sit on one line
        line = lines[row - 1]
        lines[row - 1] = line[:col] + replacement + line[end_col:]
    return "".join(lines)


def _prune(body: list[ast.stmt], scope: _Scope) -> list[ast.stmt]:
    """Drop the assignments of constants the sandbox never reads, so their values stay out of the sandbox. A mutable
    constant the sandbox does read (passed to the program, which may change it) is demoted by a second pass."""
    read = {
        node.id
        for statement in body
        for node in ast.walk(statement)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    kept = []
    for statement in body:
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            name = statement.targets[0].id
            if name not in read and (
                name in scope.constants
                or _is_literal_assignment(statement)
                or getattr(statement, "riskpo_constant", False)
            ):
                continue
        kept.append(statement)
    return kept


def _is_literal_assignment(statement: ast.Assign) -> bool:
    return not _contains([statement.value], (ast.Call, ast.Name, ast.Attribute, ast.Subscript))


# --- entry points ------------------------------------------------------------------------------------------------


@single_flight_cache(maxsize=4096)
def instrument_assertions(test_code: str) -> InstrumentedCheck:
    """Split check code into sandbox code and trainer-side probes, within one folding budget: `WORK_BUDGET` units,
    spent by the evaluator (elements it touches) and by the split (`NODE_COST` per AST node parsed or built), and at
    most `MAX_UNROLLED_STATEMENTS` statements. Computed once per check code however many threads ask at once.

    Raises ValueError for code that does not parse and `UndecidableTestError` for check code the trainer cannot judge
    or that needs more than its budget (the message says which construct or limit).
    """
    if len(test_code) > MAX_CHECK_CODE_CHARS:
        raise UndecidableTestError(
            f"check code of more than {MAX_CHECK_CODE_CHARS} characters", f"{len(test_code)} characters"
        )
    try:
        tree = ast.parse(_spell_out_long_ints(test_code))
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError) as exc:
        raise ValueError(f"assert-style test code does not parse: {exc}") from exc
    demoted: set[str] = set()
    try:
        with work_budget(WORK_BUDGET):  # folding the check's own constants: bounded however they are written
            charge(NODE_COST * sum(1 for _ in ast.walk(tree)))
            while True:  # each further pass demotes at least one name, so this ends
                splitter = _Splitter(tree, demoted)
                check = splitter.run()
                sandbox = ast.parse(check.sandbox_code)
                read = {
                    node.id
                    for node in ast.walk(sandbox)
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
                }
                newly = (read & splitter.mutable_constants) - demoted
                if not newly:
                    return check
                demoted |= newly
    except RecursionError as exc:
        raise UndecidableTestError("check code nested too deeply") from exc
    except EvaluationFailed as exc:  # the split's own nodes went beyond the budget (values are refused where read)
        raise UndecidableTestError("check code that needs more than its folding budget", str(exc)) from exc


def assertions_pass(observed: str, check: InstrumentedCheck) -> bool:
    """Whether the sandbox's leaf records (JSON ``[[probe index, [leaf values]], ...]``) satisfy every probe.

    Every probe must have been reached exactly once, as straight-line check code reaches it (so a program can neither
    pass by skipping the check nor make the trainer evaluate a probe more often than the check code has assertions),
    and every record must hold when evaluated here.
    """
    try:
        records = bounded_json.loads(observed, max_bytes=MAX_OBSERVED_CHARS)
    except ValueError:
        return False
    if not isinstance(records, list):
        return False
    probes = check.probes
    reached = set()
    for record in records:
        if not (
            isinstance(record, list)
            and len(record) == 2
            and type(record[0]) is int
            and 0 <= record[0] < len(probes)
            and isinstance(record[1], list)
            and len(record[1]) == probes[record[0]].n_leaves
            and record[0] not in reached
        ):
            return False
        try:
            with work_budget(JUDGE_WORK_BUDGET):
                if not truth(evaluate(probes[record[0]].expression, [decode_value(leaf) for leaf in record[1]])):
                    return False
        except (EvaluationFailed, RecursionError):
            return False
        reached.add(record[0])
    return len(reached) == len(probes)
