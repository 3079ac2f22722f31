"""The package's imports flow one way: no cycle between modules nor between folders (imports inside functions count)
and no module imports a folder on a higher layer of docs/architecture.md (a library module never imports an entry
point; the risk math never imports the trainer; the data and reward layers never import a track)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "riskpo_trl"
ENTRY_POINTS = ("riskpo_trl.scripts",)

# The layers of docs/architecture.md, bottom (0) to top; a module may import its own layer and those below. Folders
# on one layer sit beside each other; the folder cycle check keeps them from leaning on each other both ways.
LAYERS = {
    "riskpo_trl.registry": 0,
    "riskpo_trl.compat": 0,
    "riskpo_trl.tiny_model": 0,
    "riskpo_trl.hub_access": 0,
    "riskpo_trl.lazy": 0,
    "riskpo_trl.risk": 1,
    "riskpo_trl.rewards": 1,
    "riskpo_trl.data": 1,
    "riskpo_trl.weight_sync": 1,
    "riskpo_trl.code": 2,
    "riskpo_trl.multimodal": 2,
    "riskpo_trl.tracks": 2,  # the tracks' entries in the data and reward registries
    "riskpo_trl.evaluation": 3,
    "riskpo_trl.trainer": 3,
    "riskpo_trl.job": 4,  # the guard rails a run applies to whichever trainer it builds
    "riskpo_trl.scripts": 5,
    "riskpo_trl": 6,  # the package's lazy __init__ re-exports the public names
}


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package_dir: Path) -> dict[str, Path]:
    return {module_name(path, package_dir): path for path in package_dir.rglob("*.py")}


MODULES = package_modules(PACKAGE_DIR)


def imported_modules(name: str, path: Path, modules: dict[str, Path] = MODULES) -> set[str]:
    """Every riskpo_trl module ``name`` imports, at any depth of its code (inside functions too); ``from pkg import
    sub`` counts as ``sub`` when ``sub`` is a module, else as ``pkg``."""
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
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import riskpo_trl.x.y` of an attribute path
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    modules = package_modules(package_dir)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


GRAPH = import_graph(PACKAGE_DIR)


def folder_of(module: str) -> str:
    """The folder (sub-package) ``module`` lives in, or the module itself for a top-level one."""
    return ".".join(module.split(".")[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folder imports which: one arrow per module import that crosses folders."""
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        folders.setdefault(folder_of(name), set()).update(
            folder_of(t) for t in targets if folder_of(t) != folder_of(name)
        )
    return folders


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                return stack[stack.index(successor) :] + [successor]
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


def layer_of(module: str) -> int:
    """The layer of ``module``: its longest prefix in LAYERS."""
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    found = {name: sorted(t for t in targets if layer_of(t) > layer_of(name)) for name, targets in graph.items()}
    return {name: targets for name, targets in found.items() if targets}


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    assert "riskpo_trl.code.data" in GRAPH["riskpo_trl.tracks"]  # imported inside a loader function
    assert "riskpo_trl.rewards.grading" in GRAPH["riskpo_trl.rewards.registry"]  # `from .grading import ...`
    assert "riskpo_trl.trainer.riskpo_trainer" in GRAPH["riskpo_trl.trainer.registry"]
    assert "riskpo_trl.code.reward" in GRAPH["riskpo_trl.tracks"]  # lazily, inside the code builder
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_folder_leans_on_another_both_ways():
    """No ring of folders, e.g. data -> code (a track's loader) -> data (local files): a track is registered from
    the floor above, so the data and reward layers never import it."""
    cycle = find_cycle(folder_graph(GRAPH))
    assert cycle is None, "folder cycle: " + " -> ".join(cycle)


def test_a_function_level_import_that_closes_a_ring_is_caught(tmp_path):
    """Plant, in a copy of the package, a data loader that imports a track inside its function body (as the data layer
    once did): the folder check finds the ring, and the layer check the import that points up."""
    copy = tmp_path / "riskpo_trl"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    datasets_module = copy / "data" / "datasets.py"
    planted = "\n\ndef _planted_loader(split):\n    from ..code.data import load_archer_code\n\n    return load_archer_code(split)\n"
    datasets_module.write_text(datasets_module.read_text() + planted)
    graph = import_graph(copy)
    assert find_cycle(graph) is None  # no cycle between modules: only the folders form a ring
    assert find_cycle(folder_graph(graph)) is not None
    assert "riskpo_trl.data" in find_cycle(folder_graph(graph)) and "riskpo_trl.code" in find_cycle(
        folder_graph(graph)
    )
    assert upward_imports(graph)["riskpo_trl.data.datasets"] == ["riskpo_trl.code.data"]
    assert find_cycle(folder_graph(import_graph(PACKAGE_DIR))) is None  # the copy's ring is the planted import alone


def test_every_module_has_a_layer():
    for name in MODULES:
        assert any(name == p or name.startswith(p + ".") for p in LAYERS), f"{name}: add its folder to LAYERS"


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_a_higher_layer():
    assert upward_imports(GRAPH) == {}


def test_an_upward_import_is_caught():
    graph = {**GRAPH, "riskpo_trl.risk.batch": GRAPH["riskpo_trl.risk.batch"] | {"riskpo_trl.trainer.config"}}
    assert upward_imports(graph)["riskpo_trl.risk.batch"] == ["riskpo_trl.trainer.config"]


def test_library_modules_never_import_the_entry_points():
    upward = {
        name: sorted(t for t in targets if t.startswith(ENTRY_POINTS))
        for name, targets in GRAPH.items()
        if not name.startswith(ENTRY_POINTS)
    }
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_the_risk_math_imports_neither_trl_nor_transformers():
    for name, path in MODULES.items():
        if name.startswith("riskpo_trl.risk"):
            source = path.read_text()
            assert "import trl" not in source and "from trl" not in source, name
            assert "transformers" not in source, name


def test_leaf_modules_import_nothing_from_the_package():
    """Leaves import no module of the package but other leaves (the data-file checks use the nesting scan)."""
    leaves = {
        "riskpo_trl.registry",
        "riskpo_trl.lazy",
        "riskpo_trl.tiny_model",
        "riskpo_trl.rewards.grading",
        "riskpo_trl.rewards.completions",
        "riskpo_trl.data.local_files",
        "riskpo_trl.data.json_nesting",
        "riskpo_trl.data.isolated_build",
        "riskpo_trl.scripts.console",
    }
    for leaf in leaves:
        assert GRAPH[leaf] <= leaves - {leaf}, leaf
    assert GRAPH["riskpo_trl.data.json_nesting"] == set()


def test_the_docs_list_the_registered_trainers():
    from riskpo_trl.trainer.registry import TRAINERS

    architecture = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    assert "(the `trainer:` registry: " + ", ".join(f"`{name}`" for name in TRAINERS) + ")" in architecture
    assert "TRAINERS: " + " | ".join(TRAINERS) + " -> (config, trainer)" in architecture


def test_the_code_layer_and_its_judge_load_only_the_standard_library():
    """`riskpo_trl.code` (the reward, the sandbox, the executors) and the judge process import no torch,
    transformers, TRL or math-verify: the code layer imports in an interpreter without site-packages (``-I -S``, as
    the judge runs), where none of them exists, and with them installed it loads none of them."""
    import json
    import subprocess
    import sys

    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import riskpo_trl, riskpo_trl.code; "
        "from riskpo_trl.code import CodeReward, EXECUTORS, code_reward; import riskpo_trl.code._judge_main; "
        "print(json.dumps({'heavy': [m for m in ('torch', 'transformers', 'trl', 'datasets', 'math_verify') "
        "if m in sys.modules], 'package': riskpo_trl.__file__, 'executors': list(EXECUTORS)}))"
    )
    root = str(PACKAGE_DIR.parent)
    for flags in ([], ["-I", "-S", "-B"]):
        done = subprocess.run(
            [sys.executable, *flags, "-c", probe, root], capture_output=True, text=True, timeout=120, cwd="/"
        )
        assert done.returncode == 0, done.stderr[-2000:]
        loaded = json.loads(done.stdout.strip().splitlines()[-1])
        assert loaded == {"heavy": [], "package": str(PACKAGE_DIR / "__init__.py"), "executors": ["bwrap", "none"]}
    from riskpo_trl.code import judge

    assert "sys.modules" not in judge._BOOT  # the judge imports the real package, faking nothing


def test_one_did_you_mean_implementation():
    """Every "did you mean" hint comes from ``riskpo_trl.registry.closest``: no other module (of the package, its
    benchmarks or examples) imports difflib."""
    root = PACKAGE_DIR.parent
    importers = []
    for path in [*PACKAGE_DIR.rglob("*.py"), *(root / "benchmarks").rglob("*.py"), *(root / "examples").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == "difflib" for name in names):
                importers.append(str(path.relative_to(root)))
    assert importers == ["riskpo_trl/registry.py"]


def test_the_config_module_holds_the_fields_and_post_init_only():
    """Validation lives in trainer/config_checks.py, the GRPO conversion and the typo hint in
    trainer/config_conversion.py, the warnings' attribution in trainer/caller_warnings.py."""
    tree = ast.parse((PACKAGE_DIR / "trainer" / "config.py").read_text())
    (config_class,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    methods = [node.name for node in config_class.body if isinstance(node, ast.FunctionDef)]
    assert methods == ["from_grpo_config", "__post_init__"]
    from_grpo = next(node for node in config_class.body if getattr(node, "name", "") == "from_grpo_config")
    assert len(from_grpo.body) == 2  # its docstring and the call of config_conversion.from_grpo_config


def test_the_lazy_package_roots_list_and_serve_every_public_name():
    import riskpo_trl
    import riskpo_trl.code

    for package in (riskpo_trl, riskpo_trl.code):
        assert set(package.__all__) <= set(dir(package))
        assert all(getattr(package, name) is not None for name in package.__all__)
    from riskpo_trl import RiskPOConfig, RiskPOTrainer  # noqa: F401 - the documented import
    from riskpo_trl.code import EXECUTORS, CodeReward  # noqa: F401


def test_the_docs_name_every_private_api_the_package_touches():
    """docs/architecture.md's "How RiskPO plugs into GRPOTrainer" names each private method and attribute that
    compat.private_api lists, so a new use of TRL's private API is explained there too."""
    from riskpo_trl.compat import private_api

    architecture = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    section = architecture.split("## How RiskPO plugs into GRPOTrainer")[1].split("\n## ")[0]
    tables = (private_api.PRIVATE_METHODS, private_api.PRIVATE_CLASS_ATTRIBUTES, private_api.PRIVATE_ATTRIBUTES)
    names = [name for table in tables for names in table.values() for name in names]
    assert [name for name in names if f"`{name}" not in section] == []
