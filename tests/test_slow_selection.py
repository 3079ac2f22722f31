"""Slow tests run only when asked: `--runslow`, `RUN_SLOW=1`, or a `-m` expression (which then selects on its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

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
