"""RiskPOTrainer reads in one sitting: everything importing its module loads from this package (its import closure:
every import, inside functions too, the packages above each module, a lazy ``__init__``'s name resolved to its home
module) is at most MAX_CLOSURE_LINES lines and holds none of the job layer (the weight-sync transport, Hub access, the
tiny model, the warning filters, the resumed schedule, the run lock, preemption), and no module of it imports one of
this package's modules by a string (``importlib.import_module``), which would hide an import from this count."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "riskpo_trl"
TRAINER_MODULE = "riskpo_trl.trainer.riskpo_trainer"
MAX_CLOSURE_LINES = 4000
# The job layer and what only a job needs: none of it may load with the trainer.
JOB_LAYER = (
    "riskpo_trl.job",  # start-up checks, warning filters, resumed schedule, model card, run lock, preemption
    "riskpo_trl.weight_sync",  # the vLLM server's weight-sync transport and its checks
    "riskpo_trl.hub_access",
    "riskpo_trl.tiny_model",
    "riskpo_trl.multimodal",
    "riskpo_trl.scripts",
)
# The one module that imports this package's modules by name: the lazy __init__ files' loader, whose names this walk
# resolves from each __init__'s _EXPORTS literal.
LAZY_LOADER = "riskpo_trl.lazy"
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__"})


def module_files(package_dir: Path) -> dict[str, Path]:
    files = {}
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (what tools read, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not _is_type_checking(child))


def lazy_exports(tree: ast.AST) -> dict[str, str]:
    """A lazy ``__init__``'s ``_EXPORTS`` literal as ``{name: home module (relative)}``; empty for another module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            exports = ast.literal_eval(node.value)
            return {name: home for home, names in exports.items() for name in names}
    return {}


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:  # `import riskpo_trl.x.y` of an attribute path
        target = target.rpartition(".")[0]
    return target or None


def runtime_imports(name: str, path: Path, modules: dict[str, Path], exports: dict[str, dict[str, str]]) -> set[str]:
    """The package's modules that running ``name`` imports, inside functions too: ``from pkg import x`` is module
    ``pkg.x`` if there is one, else ``pkg`` and, for a lazy ``pkg``, the home module ``x`` loads from; a lazy package
    bound as an object (``import pkg.x``, ``from . import pkg``) counts every home module of its names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
            # `import pkg.sub.mod` binds `pkg`: any name of a lazy package on that path may then load; all count.
            targets += [
                home
                for target in list(targets)
                for prefix in with_parents(target)
                for home in _all_homes(prefix, exports)
            ]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")
                source = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            targets = [source]
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    targets.append(f"{source}.{alias.name}")
                    targets += _all_homes(f"{source}.{alias.name}", exports)  # a lazy package as an object
                elif alias.name in exports.get(source, {}):
                    targets.append(f"{source}.{exports[source][alias.name]}")
        else:
            continue
        found.update(t for t in (_resolve(target, modules) for target in targets) if t and t != name)
    return found


def _all_homes(package: str, exports: dict[str, dict[str, str]]) -> list[str]:
    return [f"{package}.{home}" for home in set(exports.get(package, {}).values())]


def with_parents(module: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``: importing a module runs the ``__init__`` of each package above it."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def import_closure(start: str, package_dir: Path = PACKAGE_DIR) -> dict[str, int]:
    """``{module: its lines}`` for every module of the package that importing ``start`` can load."""
    modules = module_files(package_dir)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    exports = {name: lazy_exports(tree) for name, tree in trees.items() if modules[name].name == "__init__.py"}
    seen: set[str] = set()
    todo = with_parents(start)
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        for target in runtime_imports(module, modules[module], modules, exports):
            todo.extend(with_parents(target))
    return {module: len(modules[module].read_text().splitlines()) for module in seen}


def string_imports(module: str, path: Path) -> list[str]:
    """Where ``module`` calls ``importlib.import_module`` or ``__import__`` with one of this package's module names
    (an absolute ``riskpo_trl`` name, a relative one, or a name it cannot see: a variable)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if function not in DYNAMIC_IMPORTS or not node.args:
            continue
        argument = node.args[0]
        literal = argument.value if isinstance(argument, ast.Constant) else None
        relative = len(node.args) > 1 or any(keyword.arg == "package" for keyword in node.keywords)
        names_the_package = isinstance(literal, str) and literal.startswith(("riskpo_trl", "."))
        if relative or names_the_package or not _third_party_names(module, path, argument):
            found.append(f"{module}:{node.lineno}")
    return found


def _third_party_names(module: str, path: Path, argument: ast.AST) -> bool:
    """Whether a dynamic import's argument is another library's module by a literal, or the loop variable over a
    module-level literal of such names (compat's check of vLLM's API)."""
    if isinstance(argument, ast.Constant):
        return isinstance(argument.value, str) and not argument.value.startswith(("riskpo_trl", "."))
    if not isinstance(argument, ast.Name):
        return False
    tree = ast.parse(path.read_text(), str(path))
    literals = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.For)
            and argument.id in {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        ):
            continue
        source = node.iter.func.value if isinstance(node.iter, ast.Call) else node.iter  # NAMES or NAMES.items()
        value = literals.get(getattr(source, "id", None))
        names = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
        strings = [n.value for n in names if isinstance(n, ast.Constant)]
        return (
            bool(strings)
            and len(strings) == len(names)
            and not any(n.startswith(("riskpo_trl", ".")) for n in strings)
        )
    return False


def job_modules_in(closure: dict[str, int]) -> list[str]:
    return sorted(m for m in closure if any(m == job or m.startswith(job + ".") for job in JOB_LAYER))


def hidden_imports(closure: dict[str, int], package_dir: Path = PACKAGE_DIR) -> list[str]:
    files = module_files(package_dir)
    return [
        hit for module in sorted(closure) if module != LAZY_LOADER for hit in string_imports(module, files[module])
    ]


def closure_listing(closure: dict[str, int]) -> str:
    return ", ".join(f"{m} ({n})" for m, n in sorted(closure.items(), key=lambda item: -item[1]))


def test_the_trainer_module_loads_no_job_layer_and_no_import_by_a_string():
    closure = import_closure(TRAINER_MODULE)
    assert job_modules_in(closure) == [], closure_listing(closure)
    assert hidden_imports(closure) == []


def test_the_trainer_module_loads_at_most_4000_lines():
    closure = import_closure(TRAINER_MODULE)
    total = sum(closure.values())
    assert total <= MAX_CLOSURE_LINES, f"{len(closure)} modules, {total} lines: {closure_listing(closure)}"


def test_the_walk_counts_function_level_lazy_and_string_imports(tmp_path):
    """Planted in a copy of the package, a function-level import of the weight sync, a lazy package's name and an
    import by a string are each found."""
    copy = tmp_path / "riskpo_trl"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert job_modules_in(import_closure(TRAINER_MODULE, copy)) == []
    trainer = copy / "trainer" / "riskpo_trainer.py"
    source = trainer.read_text()

    trainer.write_text(source + "\n\ndef _planted():\n    from ..weight_sync.client import open_client\n")
    assert "riskpo_trl.weight_sync.client" in job_modules_in(import_closure(TRAINER_MODULE, copy))

    for planted in ("from ..job import prepare", "from .. import job", "import riskpo_trl.job"):
        trainer.write_text(source + f"\n\ndef _planted():\n    {planted}\n")
        assert "riskpo_trl.job.guard_rails" in job_modules_in(import_closure(TRAINER_MODULE, copy)), planted

    for planted in ('importlib.import_module("riskpo_trl.job.guard_rails")', 'importlib.import_module(".job", "x")'):
        trainer.write_text(source + f"\n\ndef _planted():\n    import importlib\n\n    {planted}\n")
        closure = import_closure(TRAINER_MODULE, copy)
        assert hidden_imports(closure, copy) == [f"{TRAINER_MODULE}:{len(source.splitlines()) + 6}"], planted
    assert hidden_imports(import_closure(TRAINER_MODULE)) == []  # compat's literal vLLM names pass


def test_the_what_riskpo_changes_table_names_the_trainer_modules_that_load_with_it():
    """docs/architecture.md's "What RiskPO changes" lists each difference from GRPOTrainer with where it lives: every
    module it names loads with the trainer (a difference moved to the job layer leaves the table), and every module of
    the trainer layer that loads with it is named (a new difference enters the table)."""
    import re

    architecture = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    table = architecture.split("## What RiskPO changes")[1].split("**The job layer**")[0]
    named = {
        name
        for row in table.splitlines()
        if row.startswith("| ") and not row.startswith("| ---")
        for name in re.findall(r"`([\w/]+\.py|[\w]+/)`", row.rsplit("|", 2)[-2])
    }
    closure = import_closure(TRAINER_MODULE)
    files = {str(path.relative_to(PACKAGE_DIR)): module for module, path in module_files(PACKAGE_DIR).items()}
    for name in named:
        matches = [f for f in files if f == name or f.endswith("/" + name) or f.startswith(name)]
        assert matches and any(files[f] in closure for f in matches), f"{name} is named but does not load"
    trainer_layer = {m.rpartition(".")[2] + ".py" for m in closure if m.startswith("riskpo_trl.trainer.")}
    assert sorted(trainer_layer - named) == []
