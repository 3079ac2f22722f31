"""NaN rewards are named as NaN, with the function and the count, by the job layer's reward accounting; TRL alone
reports them as None."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job
from riskpo_trl.job.reward_accounting import UnscoredCounts, count_unscored


def nan_for_small_answers(completions, solution, **kwargs):
    """NaN for the completions of prompts whose answer is below 3 (2 of the 4 prompts), else the digit reward."""
    rewards = contains_digit_reward(completions)
    return [math.nan if int(s) < 3 else r for r, s in zip(rewards, solution)]


def always_nan(completions, **kwargs):
    return [float("nan")] * len(completions)


async def async_none(completions, **kwargs):
    await asyncio.sleep(0)
    return [None] * len(completions)


def config(tmp_path, **overrides) -> RiskPOConfig:
    settings = dict(
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        bundle_size=2,
        max_completion_length=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        logging_steps=1,
        seed=3,
    )
    return tiny_config(tmp_path, run=False, **{**settings, **overrides})


def test_counts_tell_none_from_nan():
    assert count_unscored([None, float("nan"), 1.0, 0.0, math.nan, None]) == (2, 2)
    counts = UnscoredCounts(["a", "b", "c"], none=[0, 3, 1], nan=[2, 0, 1])
    assert counts.describe() == "a: 2 NaN; b: 3 None; c: 1 NaN, 1 None"


@pytest.mark.slow
def test_partial_nan_is_named_with_its_function_and_count(tiny_model_dir, tmp_path, caplog):
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=nan_for_small_answers,
        args=config(tmp_path),
        train_dataset=make_prompt_dataset(4),
    )
    batches = []
    trainer.add_batch_observer(batches.append)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    rewards = batches[-1].rewards_per_func[:, 0]
    nan_count = int(rewards.isnan().sum())
    assert nan_count == 4
    assert f"Reward function nan_for_small_answers returned NaN for {nan_count} of 8 completions" in caplog.text
    assert f"(nan_for_small_answers: {nan_count} NaN)" in caplog.text
    assert "returned None" not in caplog.text


@pytest.mark.slow
def test_all_nan_stops_naming_nan_and_none_per_function(tiny_model_dir, tmp_path, caplog):
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=[always_nan, async_none],
        train_dataset=make_prompt_dataset(4),
        args=config(tmp_path, max_steps=3, max_unscorable_batches=1),
    )
    with pytest.raises(RuntimeError) as error, caplog.at_level(logging.WARNING):
        trainer.train()
    assert "(last batch on this process: always_nan: 8 NaN; async_none: 8 None)" in str(error.value)
    assert "Reward function always_nan returned NaN for 8 of 8 completions" in caplog.text
    assert "async_none returned NaN" not in caplog.text


def mean_digit_reward(completions, **kwargs):
    """A common mistake: one number for the batch instead of one per completion."""
    rewards = contains_digit_reward(completions)
    return sum(rewards) / len(rewards)


def test_a_reward_returning_a_float_is_named_with_what_it_must_return(tiny_model_dir, tmp_path):
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=[contains_digit_reward, mean_digit_reward],
        args=config(tmp_path),
        train_dataset=make_prompt_dataset(4),
    )
    with pytest.raises(
        TypeError,
        match=r"^Reward function mean_digit_reward returned float '[0-9.]+'; it must return "
        r"a list with one float \(or None\) per completion \(8 here\)\.$",
    ):
        trainer.train()


def test_a_reward_returning_too_few_values_is_named():
    from riskpo_trl.job.reward_accounting import check_reward_output

    check_reward_output("ok", [1.0, None], 2)
    with pytest.raises(ValueError, match=r"^Reward function short returned 1 values for 2 completions"):
        check_reward_output("short", [1.0], 2)
    with pytest.raises(TypeError, match=r"^Reward function text returned str 'yes'"):
        check_reward_output("text", "yes", None)
