"""The regime guard: its batch signal, its counting, and its warning inside a real training run."""

from __future__ import annotations

import warnings

import helpers
import pytest
import torch
from helpers import make_prompt_dataset
from test_trainer import tiny_config

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.risk import frac_prompts_all_failed, riskpo_advantages
from riskpo_trl.risk.estimator import RiskEstimator
from riskpo_trl.trainer.regime_guard import RegimeGuard, RegimeWarning


def paper_batch(rewards: list[float]):
    """The paper's MVaR advantage of one batch of 10 prompts x 4 completions, bundles of 5, quantiles from the batch."""
    r = torch.tensor(rewards)
    return riskpo_advantages(
        r,
        num_generations=4,
        bundle_size=5,
        q_alpha=1.0,
        q_beta=3.0,
        omega=0.5,
        generator=torch.Generator().manual_seed(0),
        advantage_baseline="none",
    )


def test_a_low_success_batch_pushes_everything_down_and_a_healthy_one_both_ways():
    # Nearly nothing solved: every bundle scores at or below q_alpha, so the paper's advantage is negative throughout.
    low = paper_batch([1.0] + [0.0] * 39).push_metrics()
    assert low["risk/frac_negative_advantage"] == 1.0 and low["risk/frac_positive_advantage"] == 0.0
    assert low["risk/frac_prompts_all_failed"] == 0.9  # 9 of the 10 prompts: no completion right
    # Half solved, the authors' advantage (quantiles and centring per bundle group): pushed both ways, and the better
    # a completion scored the higher its advantage.
    rewards = (torch.rand(40, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    authors = RiskEstimator(
        num_generations=4,
        bundle_size=5,
        alpha=0.2,
        beta=0.8,
        omega=1.5,
        quantile_source="group",
        advantage_scaling="authors_code",
        natural_baseline=False,
        credit_assignment="sum_mean",
    )
    healthy = authors.step(rewards, generator=torch.Generator().manual_seed(1), train=True).push_metrics()
    assert 0 < healthy["risk/frac_negative_advantage"] < 0.5 and healthy["risk/frac_positive_advantage"] > 0
    assert healthy["risk/reward_advantage_corr"] > 0
    assert healthy["risk/frac_prompts_all_failed"] < 0.5


def test_all_failed_prompts_count_scorable_completions_only():
    # Prompt 1: right once; prompt 2: all wrong (1/-1 rewards); prompt 3: unscorable but for one wrong answer;
    # prompt 4: nothing scorable, left out.
    nan = float("nan")
    rewards = torch.tensor([0, 1, 0, 0, -1, -1, -1, -1, nan, nan, 0, nan, nan, nan, nan, nan])
    assert frac_prompts_all_failed(rewards, num_generations=4) == 2 / 3
    assert frac_prompts_all_failed(torch.full((8,), nan), num_generations=4) is None


def test_unscorable_completions_do_not_count_and_no_spread_means_no_correlation():
    batch = paper_batch([float("nan")] * 20 + [0.0] * 20)
    metrics = batch.push_metrics()
    assert metrics["risk/frac_negative_advantage"] == 1.0  # of the 20 scorable ones, all pushed down
    assert "risk/reward_advantage_corr" not in metrics  # every scorable reward is 0: no correlation to speak of
    assert metrics["risk/frac_prompts_all_failed"] == 1.0  # the 5 prompts with scorable completions: all wrong
    assert paper_batch([float("nan")] * 40).push_metrics() == {}


def test_guard_warns_once_after_patience_batches_in_a_row():
    guard = RegimeGuard(threshold=0.5, patience=3)
    degenerate = {
        "risk/frac_prompts_all_failed": 0.8,
        "risk/frac_negative_advantage": 0.9,
        "risk/frac_positive_advantage": 0.0,
    }
    healthy = {"risk/frac_prompts_all_failed": 0.2, "risk/frac_negative_advantage": 0.8}
    assert [guard.observe(m) for m in (degenerate, degenerate, healthy, degenerate, degenerate)] == [None] * 5
    message = guard.observe(degenerate)
    assert message and "3 training batches in a row" in message and "latest batch: 80%" in message
    assert "90% of the completions pushed down, 0% up" in message
    # The warning states the scale of its evidence and that it is post hoc, and keeps no study results.
    assert "0.5M-parameter model" in message and "lr 3e-5 to 1e-4" in message and "Post hoc" in message
    assert "did not predict which runs collapsed" in message and "docs/replication.md" in message
    assert "Pass@" not in message and "0.1" not in message
    assert "regime_guard_patience=0" in message
    assert guard.observe(degenerate) is None  # once per run
    assert RegimeGuard(0.7, patience=0).observe(degenerate) is None
    guard = RegimeGuard(0.7, patience=2)
    assert guard.observe(degenerate) is None and guard.observe({}) is None  # a batch without the metric: no change
    assert guard.observe(degenerate) is not None
    restored = RegimeGuard(0.7, patience=2)
    restored.load_state_dict(guard.state_dict())
    assert restored.warned and restored.observe(degenerate) is None


def test_guard_is_opt_in_and_its_help_says_post_hoc(tmp_path):
    from dataclasses import fields

    assert helpers.tiny_config(tmp_path, run=False).regime_guard_patience == 0
    # (transformers 4.x has a TrainingArguments field without a help text)
    help_text = next(f.metadata["help"] for f in fields(RiskPOConfig) if f.name == "regime_guard_patience")
    assert "opt-in" in help_text and "post hoc" in help_text.lower() and "0.5M-parameter" in help_text
    with pytest.raises(ValueError, match="share of prompts"):
        helpers.tiny_config(tmp_path, run=False, regime_guard_threshold=2.0)


def test_a_trainer_with_default_settings_has_the_guard_off(tiny_model_dir, tmp_path):
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=always_wrong,
        args=tiny_config(tmp_path, max_steps=2),
        train_dataset=make_prompt_dataset(),
    )
    assert trainer.regime_guard.patience == 0
    assert all(trainer.regime_guard.observe({"risk/frac_prompts_all_failed": 1.0}) is None for _ in range(50))


@pytest.mark.parametrize(
    "field, value", [("regime_guard_threshold", 0.0), ("regime_guard_threshold", 1.5), ("regime_guard_patience", -1)]
)
def test_guard_settings_are_checked(field, value, tmp_path):
    with pytest.raises(ValueError, match=field):
        helpers.tiny_config(tmp_path, run=False, **{field: value})


def always_wrong(completions, **kwargs):
    return [0.0] * len(completions)


def right_half_the_time(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


def train_recording_warnings(tiny_model_dir, tmp_path, reward, **overrides):
    args = tiny_config(tmp_path, max_steps=4, regime_guard_threshold=0.5, regime_guard_patience=2, **overrides)
    trainer = RiskPOTrainer(tiny_model_dir, reward_funcs=reward, args=args, train_dataset=make_prompt_dataset())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    logged = [
        e["risk/frac_prompts_all_failed"] for e in trainer.state.log_history if "risk/frac_prompts_all_failed" in e
    ]
    return [w for w in caught if issubclass(w.category, RegimeWarning)], logged


@pytest.mark.slow
def test_training_in_the_degenerate_regime_warns_once(tiny_model_dir, tmp_path):
    # Nothing is ever solved: every prompt of every batch is all wrong.
    regime, logged = train_recording_warnings(tiny_model_dir, tmp_path, always_wrong)
    assert logged == [1.0, 1.0, 1.0, 1.0]
    assert len(regime) == 1 and "2 training batches in a row" in str(regime[0].message)


@pytest.mark.slow
def test_the_guard_leaves_the_authors_advantage_alone(tiny_model_dir, tmp_path):
    # Same degenerate data; the study saw the authors' advantage collapse at neither learning rate there.
    regime, logged = train_recording_warnings(
        tiny_model_dir,
        tmp_path,
        always_wrong,
        advantage_scaling="authors_code",
        quantile_source="group",
        natural_baseline=False,
        credit_assignment="sum_mean",
        risk_omega=1.5,
    )
    assert logged == [1.0, 1.0, 1.0, 1.0] and not regime  # logged all the same


@pytest.mark.slow
def test_training_in_a_healthy_regime_stays_quiet(tiny_model_dir, tmp_path):
    # The paper's advantage, whose guard is on, with every prompt solved half the time.
    regime, logged = train_recording_warnings(tiny_model_dir, tmp_path, right_half_the_time)
    assert logged == [0.0, 0.0, 0.0, 0.0] and not regime
