"""Folding dataset check code in the trainer is bounded, and each cell is folded once however many workers ask.

The whole-trainer bounds (CPU, peak memory, wall clock) of a hostile cell are measured in a fresh process by
`tests/test_sandbox_attacks.py`; here, the limits themselves and the single-flight cache.
"""

from __future__ import annotations

import threading
import time

import pytest

from riskpo_trl.code import assertions
from riskpo_trl.code.assertions import (
    MAX_CHECK_CODE_CHARS,
    MAX_UNROLLED_STATEMENTS,
    UndecidableTestError,
    instrument_assertions,
)
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.single_flight import SingleFlightCache
from riskpo_trl.code.testspec import TestSpec

RED_TEAM_CELL = "for i in range(600):\n    for j in range(600):\n        pass\nassert f(1) == 2\n"
TABLE = "tests = [{rows}]\nfor t in tests:\n    assert f(*t[0]) == t[1]\n"


def _table(rows: int) -> str:
    return TABLE.format(rows=", ".join(f"(({i}, {i + 1}), {2 * i + 1})" for i in range(rows)))


def test_loops_that_unroll_beyond_the_statement_cap_are_refused_unbuilt_naming_the_count_and_the_cap():
    start = time.process_time()
    with pytest.raises(
        UndecidableTestError,
        match=f"more than {MAX_UNROLLED_STATEMENTS} statements once loops are unrolled: 720600 statements",
    ) as refused:
        instrument_assertions(RED_TEAM_CELL)
    assert time.process_time() - start < 1.0  # one inner loop built (1,201 statements), not 720,600
    assert refused.value.kind == f"more than {MAX_UNROLLED_STATEMENTS} statements once loops are unrolled"


def test_statements_are_counted_wherever_the_unrolling_builds_them():
    # each iteration alone is small, and whether the body builds anything differs between iterations
    steps = (
        "for i in range(1500):\n    if i % 2 == 1:\n        for j in range(30):\n            k = j\nassert f(1) == 2\n"
    )
    with pytest.raises(UndecidableTestError, match="statements once loops are unrolled"):
        instrument_assertions(steps)
    instrument_assertions(steps.replace("range(30)", "range(3)"))  # 750 x 6 statements: within the cap


@pytest.mark.parametrize(
    "check",
    [
        "for i in range(2000):\n    x = [" + ",".join(map(str, range(5000))) + "]\nassert f(1) == 2\n",
        "for x in [list(range(100000))] * 2000:\n    assert f(x[0]) == 1\n",
        "assert f([" + ",".join(map(str, range(140_000))) + "]) == 5\n",
    ],
    ids=["a 5,000-node body copied 2,000 times", "a 100,000-element row bound 2,000 times", "140,000 parsed nodes"],
)
def test_nodes_parsed_and_built_are_paid_from_the_folding_budget(check):
    with pytest.raises(UndecidableTestError, match="budget"):
        instrument_assertions(check)


def test_check_code_beyond_its_length_cap_is_refused_unparsed():
    with pytest.raises(UndecidableTestError, match=f"more than {MAX_CHECK_CODE_CHARS} characters"):
        instrument_assertions("assert f(1) == 2\n" + "#" * MAX_CHECK_CODE_CHARS)


def test_honest_checks_at_the_size_of_the_caps_still_fold():
    assert len(instrument_assertions(_table(2000)).probes) == 2000
    straight = "\n".join(f"assert f({i}, {i + 1}) == {2 * i + 1}" for i in range(assertions.MAX_UNROLLED_ASSERTIONS))
    assert len(instrument_assertions(straight).probes) == assertions.MAX_UNROLLED_ASSERTIONS


def test_a_large_honest_table_scores_one_and_a_wrong_program_zero():
    spec = TestSpec("assert", [_table(300)], [""]).to_json()
    reward = CodeReward(sandbox=Sandbox(SandboxLimits(total_timeout_s=20), max_workers=2))
    completions = [
        [{"role": "assistant", "content": f"```python\ndef f(a, b):\n    return {body}\n```"}]
        for body in ("a + b", "a * b")
    ]
    assert reward(completions, [spec, spec]) == [1.0, 0.0]


def _ask_at_once(function, argument, threads: int = 4) -> list:
    """What ``threads`` threads got (a value or the exception) calling ``function(argument)`` at the same moment."""
    barrier, results = threading.Barrier(threads), [None] * threads

    def ask(index: int) -> None:
        barrier.wait()
        try:
            results[index] = function(argument)
        except Exception as exc:  # noqa: BLE001 - compared below
            results[index] = exc

    workers = [threading.Thread(target=ask, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    return results


@pytest.mark.parametrize("cell", [_table(400), RED_TEAM_CELL], ids=["an honest table", "the red team's loops"])
def test_four_threads_asking_for_the_same_cell_fold_it_once(cell):
    instrument_assertions.cache_clear()
    results = _ask_at_once(instrument_assertions, cell)
    assert instrument_assertions.cache_info().misses == 1
    if cell is RED_TEAM_CELL:
        assert all(isinstance(result, UndecidableTestError) for result in results)
        assert len({id(result) for result in results}) == 4  # a fresh copy each: no traceback grows across raises
        assert all(result.kind == results[0].kind for result in results)
    else:
        assert all(result is results[0] for result in results)


def test_four_workers_scoring_one_cell_parse_it_once():
    from riskpo_trl.code import reward as reward_module

    reward_module._parse_json_tests.cache_clear()
    instrument_assertions.cache_clear()
    spec = TestSpec("assert", [_table(400)], [""]).to_json()
    reward = CodeReward(sandbox=Sandbox(SandboxLimits(total_timeout_s=20), max_workers=4))
    completions = [[{"role": "assistant", "content": "```python\ndef f(a, b):\n    return a + b\n```"}]] * 4
    assert reward(completions, [spec] * 4) == [1.0] * 4
    assert reward_module._parse_json_tests.cache_info().misses == 1
    assert instrument_assertions.cache_info().misses == 1


def test_the_single_flight_cache_remembers_refusals_but_not_other_failures():
    calls = []

    def compute(key):
        calls.append(key)
        time.sleep(0.05)
        if key == "refused":
            raise ValueError("no")
        if key == "flaky" and calls.count("flaky") == 1:
            raise OSError("transient")
        return key.upper()

    cache = SingleFlightCache(compute, maxsize=2)
    assert _ask_at_once(cache, "a") == ["A"] * 4
    refusals = _ask_at_once(cache, "refused")
    assert all(isinstance(result, ValueError) and result.__traceback__ is not None for result in refusals)
    assert calls == ["a", "refused"]
    flaky = _ask_at_once(cache, "flaky")
    assert sum(isinstance(result, OSError) for result in flaky) == 1 and flaky.count("FLAKY") == 3
    assert calls.count("flaky") == 2  # the failure was not remembered: the next caller computed it again
    cache("b")
    cache("c")  # beyond maxsize=2: the least recently used ("refused") is dropped
    assert cache.cache_info().currsize == 2
    with pytest.raises(ValueError):
        cache("refused")
    assert calls.count("refused") == 2


def test_dataset_folding_benchmark_runs_tiny(tmp_path):
    from benchmarks import dataset_folding

    payload = dataset_folding.main(
        [
            "--runs",
            "1",
            "--cells",
            "red team: 600 x 600 loops of pass",
            "honest: a 2,000-row loop table",
            "--out",
            str(tmp_path),
        ]
    )
    cells = payload["cells"]
    assert cells["red team: 600 x 600 loops of pass"]["outcome"].startswith("refused: more than 20000 statements")
    assert cells["honest: a 2,000-row loop table"]["outcome"] == "folded: 2000 probes"
    assert all(cell["computations"] == 1 and cell["cpu_s_median"] > 0 for cell in cells.values())
    assert (tmp_path / "dataset_folding.md").exists()
