"""The package's imports flow one way: no cycle (imports inside functions count) and no library module imports an
entry point (riskpo_trl.scripts, riskpo_trl.cli)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "riskpo_trl"
ENTRY_POINTS = ("riskpo_trl.scripts", "riskpo_trl.cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}


def imported_modules(name: str, path: Path) -> set[str]:
    """Every riskpo_trl module ``name`` imports, at any depth of its code; ``from pkg import sub`` counts as ``sub``
    when ``sub`` is a module, else as ``pkg``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import riskpo_trl.x.y` of an attribute path
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                return stack[stack.index(successor):] + [successor]
            if successor not in state:
                cycle = visit(successor)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    assert "riskpo_trl.code.data" in GRAPH["riskpo_trl.data"]  # imported inside a loader function
    assert "riskpo_trl.grading" in GRAPH["riskpo_trl.rewards"]  # `from .grading import ...`
    assert "riskpo_trl.riskpo_trainer" in GRAPH["riskpo_trl.trainers"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_modules_never_import_the_entry_points():
    upward = {
        name: sorted(t for t in targets if t.startswith(ENTRY_POINTS))
        for name, targets in GRAPH.items()
        if not name.startswith(ENTRY_POINTS)
    }
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_leaf_modules_import_nothing_from_the_package():
    for leaf in ("riskpo_trl.text", "riskpo_trl.grading", "riskpo_trl.prompts", "riskpo_trl.local_files",
                 "riskpo_trl.console", "riskpo_trl.tiny_model", "riskpo_trl.model_paths", "riskpo_trl.naming"):
        assert GRAPH[leaf] == set(), leaf
