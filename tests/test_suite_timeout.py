"""The suite's per-test timeout (pyproject.toml, pytest-timeout): a hung test fails the run instead of stalling it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
