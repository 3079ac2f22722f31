"""The package's public names are visible to type checkers and IDEs (a ``TYPE_CHECKING`` import of each, next to the
lazy map that serves it at run time) and load on first use: ``import riskpo_trl`` and ``import riskpo_trl.code``
load no torch."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = [
    "riskpo_trl",
    "riskpo_trl.code",
    "riskpo_trl.data",
    "riskpo_trl.evaluation",
    "riskpo_trl.job",
    "riskpo_trl.rewards",
    "riskpo_trl.risk",
    "riskpo_trl.trainer",
]
HEAVY = ("torch", "transformers", "trl", "datasets")


def init_file(package: str) -> Path:
    return ROOT.joinpath(*package.split("."), "__init__.py")


def type_checking_imports(tree: ast.Module) -> dict[str, set[str]]:
    """``{home module: names}`` imported under ``if TYPE_CHECKING:``."""
    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.level == 1, ast.dump(statement)
                found.setdefault(statement.module, set()).update(alias.name for alias in statement.names)
    return found


def test_every_package_init_uses_the_one_lazy_helper():
    hand_rolled = [
        str(path.relative_to(ROOT))
        for path in ROOT.joinpath("riskpo_trl").rglob("__init__.py")
        if "def __getattr__" in path.read_text()
    ]
    assert hand_rolled == []
    assert sorted(
        str(path.parent.relative_to(ROOT)).replace("/", ".")
        for path in ROOT.joinpath("riskpo_trl").rglob("__init__.py")
        if "lazy_names(" in path.read_text()
    ) == sorted(LAZY_PACKAGES)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_type_checking_block_names_exactly_the_lazy_names(package):
    module = importlib.import_module(package)
    exports = {home: set(names) for home, names in module._EXPORTS.items()}
    assert type_checking_imports(ast.parse(init_file(package).read_text())) == exports
    assert module.__all__ == sorted(name for names in exports.values() for name in names)
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        home = importlib.import_module(f"{package}.{next(h for h, names in exports.items() if name in names)}")
        assert getattr(module, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_the_check_sees_a_name_missing_from_the_type_checking_block():
    tree = ast.parse("if TYPE_CHECKING:\n    from .config import RiskPOConfig\n")
    assert type_checking_imports(tree) != {"config": {"RiskPOConfig"}, "riskpo_trainer": {"RiskPOTrainer"}}


def test_importing_the_package_and_the_code_layer_loads_no_torch():
    probe = (
        "import json, sys; import riskpo_trl, riskpo_trl.code; from riskpo_trl.code import CodeReward; "
        f"light = [m for m in {HEAVY!r} if m in sys.modules]; from riskpo_trl import RiskPOTrainer; "
        "print(json.dumps({'light': light, 'trainer': RiskPOTrainer.__module__, "
        "'torch': 'torch' in sys.modules}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"light": [], "trainer": "riskpo_trl.trainer.riskpo_trainer", "torch": True}
