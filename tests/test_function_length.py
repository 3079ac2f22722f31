"""No function of the package or the studies runs over 120 lines: a longer one is split into named steps."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 120
# Functions not yet split, each to leave this list when it is (a test below fails once one is short enough).
NOT_YET_SPLIT: set[str] = set()


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> dict[str, int]:
    """``where::name`` -> lines of every function (nested ones too) in ``source`` longer than ``limit``."""
    return {
        f"{where}::{node.name}": node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source, where))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit
    }


def project_long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for folder in ("riskpo_trl", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found.update(long_functions(path.read_text(), str(path.relative_to(ROOT))))
    return found


def test_no_function_over_120_lines():
    too_long = {name: lines for name, lines in project_long_functions().items() if name not in NOT_YET_SPLIT}
    assert too_long == {}, f"split these into named steps (at most {MAX_LINES} lines each): {too_long}"


def test_the_list_of_functions_not_yet_split_holds_only_long_ones():
    assert set(project_long_functions()) >= NOT_YET_SPLIT, "a function was split: remove it from NOT_YET_SPLIT"


def test_a_planted_long_function_is_found():
    body = textwrap.indent("".join(f"x{i} = {i}\n" for i in range(MAX_LINES)), "    ")
    method = textwrap.indent("def long(self):\n" + body, "    ")
    source = f"class Host:\n    def short(self):\n        return 1\n\n{method}"
    assert long_functions(source, "planted.py") == {"planted.py::long": MAX_LINES + 1}
    assert long_functions("def f():\n" + body, "planted.py") == {"planted.py::f": MAX_LINES + 1}
    assert long_functions("def f():\n" + body, "planted.py", limit=MAX_LINES + 1) == {}
