"""The tests about the test suite itself, in one file: what its modules may import, its timeouts and its slow-test
selection (the package's own guarantees are tested elsewhere).

**Imports.** The test suite imports only what the README's install (`pip install -e ".[dev]"`) provides.

A test module that imports a package outside that install breaks the README's test command at collection on a fresh
machine, while passing on any machine that happens to have the package. This walks every import under tests/ and
resolves it to its distribution; the distribution must be in the dependency closure of `riskpo-trl[dev]` (read from
pyproject.toml, then from the installed packages' metadata), in the standard library, or in this repository. The one
exception: inside a `vllm_real` test (skipped unless vLLM is installed), or a helper listed as called only by those, an
import may also name a requirement of the `vllm` extra, which `.ci/vllm_real.sh` installs.

**Timeouts.** The suite's per-test timeout (pyproject.toml, pytest-timeout): a hung test fails the run instead of
stalling it.

**Slow tests** run only when asked: `--runslow`, `RUN_SLOW=1`, or a `-m` expression (which then selects on its own).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

# --- what the suite imports ----------------------------------------------------------------------------------------

TESTS = ROOT / "tests"
# Helpers that only vllm_real tests call, so they may import the vllm extra like those tests: (file, function).
VLLM_ONLY_HELPERS = {("tests/helpers.py", "release_in_process_vllm")}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(requirements: list[str], extras: frozenset[str] = frozenset()) -> set[str]:
    """Normalized names of the distributions these requirements install, following installed metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(Requirement(text), extras) for text in requirements]
    while pending:
        requirement, parent_extras = pending.pop()
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": extra}) for extra in parent_extras or {""}):
            continue
        key = (normalized(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (e.g. a platform-only requirement): nothing to follow
        pending.extend((Requirement(text), key[1]) for text in requires)
    return {name for name, _ in seen}


def project() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def is_vllm_real(node: ast.AST) -> bool:
    """Whether an expression (a decorator or a pytestmark value) names the vllm_real marker."""
    return any(isinstance(sub, ast.Attribute) and sub.attr == "vllm_real" for sub in ast.walk(node))


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level module, line, inside a vllm_real test) for every absolute import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    module_marked = any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and is_vllm_real(node.value)
        for node in tree.body
    )
    found = []

    def visit(node: ast.AST, in_function: bool, marked: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            marked = (
                marked
                or (relative, node.name) in VLLM_ONLY_HELPERS
                or any(is_vllm_real(decorator) for decorator in node.decorator_list)
            )
            in_function = in_function or not isinstance(node, ast.ClassDef)
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], node.lineno, in_function and marked) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, in_function and marked))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function, marked)

    visit(tree, False, module_marked)
    return found


def is_local(name: str) -> bool:
    """This repository's own code: riskpo_trl, benchmarks, ... (pytest puts the root on sys.path) or a test helper."""
    return (ROOT / name / "__init__.py").exists() or (ROOT / f"{name}.py").exists() or any(TESTS.rglob(f"{name}.py"))


def test_every_test_import_is_installed_by_the_dev_extra():
    spec = project()
    dev = dependency_closure([*spec["dependencies"], *spec["optional-dependencies"]["dev"]])
    vllm_extra = {normalized(Requirement(text).name) for text in spec["optional-dependencies"]["vllm"]}
    owners = importlib.metadata.packages_distributions()

    missing = []
    for path in sorted(TESTS.rglob("*.py")):
        for name, line, in_vllm_real_test in imports(path):
            if name in sys.stdlib_module_names or is_local(name):
                continue
            distributions = {normalized(dist) for dist in owners.get(name, [normalized(name)])}
            if distributions & dev or (in_vllm_real_test and distributions & vllm_extra):
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            missing.append(f"{where} imports {name!r} (distribution {', '.join(sorted(distributions))})")
    assert not missing, (
        'imports that `pip install -e ".[dev]"` does not provide (add the package to the dev extra in '
        "pyproject.toml, or import it inside a vllm_real test, or use pytest.importorskip):\n" + "\n".join(missing)
    )


def test_the_check_sees_module_level_and_vllm_real_imports(tmp_path):
    """The walker itself: module-level imports count everywhere; a vllm_real test's own imports are told apart."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\nimport requests\n\n"
        "@pytest.mark.vllm_real\ndef test_a():\n    import aiohttp\n\n"
        "def test_b():\n    from vllm import LLM\n"
    )
    assert imports(sample) == [("pytest", 1, False), ("requests", 2, False), ("aiohttp", 6, True), ("vllm", 9, False)]
    marked_module = tmp_path / "test_marked.py"
    marked_module.write_text(
        "import pytest\nimport requests\npytestmark = pytest.mark.vllm_real\ndef test_c():\n    import requests\n"
    )
    assert imports(marked_module) == [("pytest", 1, False), ("requests", 2, False), ("requests", 5, True)]


def test_the_closure_follows_extras_and_markers():
    closure = dependency_closure(["pytest>=8"])
    assert {"pytest", "pluggy", "iniconfig"} <= closure
    assert "requests" not in dependency_closure(['requests; extra == "never"'])
    assert "requests" in dependency_closure(['requests; extra == "vllm"'], frozenset({"vllm"}))


# --- its timeouts ---------------------------------------------------------------------------------------------------


def test_every_test_has_a_timeout_and_long_ones_a_longer_one(request):
    assert request.config.pluginmanager.hasplugin("timeout"), "install the dev extra: pip install -e .[dev]"
    assert request.config.getini("timeout") == "600"
    from conftest import LONG_TEST_TIMEOUT_S, give_long_tests_a_longer_timeout

    long_test = pytest.Function.from_parent(request.node.parent, name=request.node.name)
    long_test.add_marker(pytest.mark.slow)

    give_long_tests_a_longer_timeout([long_test])
    assert long_test.get_closest_marker("timeout").args == (LONG_TEST_TIMEOUT_S,)


def test_a_hung_test_fails_the_run_under_the_projects_settings(tmp_path):
    hung = tmp_path / "test_hung.py"
    hung.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(600)\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
        + ["--rootdir", str(tmp_path), "-o", "timeout=2", str(hung)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "Timeout" in done.stdout + done.stderr


# --- its slow-test selection ----------------------------------------------------------------------------------------

CONFTEST = Path(__file__).with_name("conftest.py")
SAMPLE = """
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_trains():
    pass

@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks():
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    distributed: distributed\n    vllm_real: vllm\n")
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester


def run(suite, *args):
    return suite.runpytest_inprocess("-p", "no:cacheprovider", "--import-mode=importlib", *args)


def test_default_run_leaves_slow_tests_out_and_says_how_to_run_them(suite):
    result = run(suite)
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*2 tests marked slow were left out: run them with --runslow or RUN_SLOW=1*"])


@pytest.mark.parametrize("how", ["--runslow", "RUN_SLOW=1"])
def test_asking_runs_every_test(suite, monkeypatch, how):
    if how.startswith("RUN_SLOW"):
        monkeypatch.setenv("RUN_SLOW", "1")
        result = run(suite)
    else:
        result = run(suite, how)
    result.assert_outcomes(passed=3)
    assert "left out" not in result.stdout.str()


def test_a_marker_expression_selects_on_its_own(suite):
    run(suite, "-m", "slow").assert_outcomes(passed=2, deselected=1)
    run(suite, "-m", "distributed").assert_outcomes(passed=1, deselected=2)
    run(suite, "-m", "not slow").assert_outcomes(passed=1, deselected=2)


def test_a_slow_test_named_by_id_is_skipped_with_the_reason(suite):
    result = run(suite, "test_sample.py::test_trains", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*marked slow: run them with --runslow or RUN_SLOW=1*"])
