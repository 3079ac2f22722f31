"""Executors by name: a recipe's ``code_sandbox:`` block picks one from `EXECUTORS`, every registered executor passes
the contract tests, and adding one is the drill of docs/architecture.md."""

from __future__ import annotations

import pytest

from riskpo_trl.code.contracts import check_executor_contract
from riskpo_trl.code.executor import EXECUTORS, SandboxExecutor, UnisolatedExecutor
from riskpo_trl.code.reward import CodeReward, code_reward_from_settings
from riskpo_trl.registry import temporary_entries

SETTINGS = {
    "max_workers": 4,
    "test_timeout_s": 1.0,
    "total_timeout_s": 3.0,
    "cpu_time_s": 2,
    "memory_mb": 512,
    "disk_mb": 16,
    "judge_timeout_s": 4.0,
}
BOUND_S = SETTINGS["total_timeout_s"] + SETTINGS["judge_timeout_s"] + 10  # kill and reap: docs/code_sandbox.md


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_every_registered_executor_keeps_the_contract(name):
    reward = code_reward_from_settings({"executor": name, **SETTINGS})
    assert type(reward.executor) is EXECUTORS[name]
    check_executor_contract(reward.executor, BOUND_S)


def test_a_recipe_picks_the_executor_by_name_and_bwrap_is_the_default():
    default = code_reward_from_settings({"max_workers": 1})
    assert type(default.executor) is SandboxExecutor and default.sandbox.isolation.mode == "bwrap"
    unisolated = code_reward_from_settings({"executor": "none", "max_workers": 1})
    assert type(unisolated.executor) is UnisolatedExecutor and unisolated.sandbox.isolation.mode == "none"


def test_a_misspelled_executor_or_the_old_isolation_key_is_refused_naming_the_fix():
    with pytest.raises(
        ValueError,
        match=r"code_sandbox.executor='bwarp' is unknown \(did you mean bwrap\?\); "
        r"choose one of \['bwrap', 'none'\]",
    ):
        code_reward_from_settings({"executor": "bwarp"})
    with pytest.raises(ValueError, match="code_sandbox.isolation is now code_sandbox.executor: write executor: none"):
        code_reward_from_settings({"isolation": "none"})
    with pytest.raises(
        ValueError,
        match=r"unknown key\(s\) \['max_worker'\] \(did you mean max_workers for "
        r"max_worker\?\); valid keys for executor 'none'",
    ):
        code_reward_from_settings({"executor": "none", "max_worker": 2})


class CountingExecutor(SandboxExecutor):
    verdicts = 0

    def run(self, program, tests):
        verdict = super().run(program, tests)
        type(self).verdicts += 1
        return verdict


def test_a_new_executor_is_one_registered_class_and_its_contract_tests():
    """The drill of docs/architecture.md: register a class with ``from_settings``, run the contract tests on it, and
    a recipe picks it by name (a misspelling gets the closest name); registered for the test only."""
    with temporary_entries():
        EXECUTORS.register("counted", help="the bubblewrap executor, counting its verdicts")(CountingExecutor)
        reward = code_reward_from_settings({"executor": "counted", **SETTINGS})
        assert isinstance(reward, CodeReward) and type(reward.executor) is CountingExecutor
        check_executor_contract(reward.executor, BOUND_S)
        assert CountingExecutor.verdicts == 9
        with pytest.raises(ValueError, match=r"did you mean counted\?"):
            code_reward_from_settings({"executor": "countd"})
    assert "counted" not in EXECUTORS
