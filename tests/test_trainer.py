"""RiskPOTrainer end to end on a tiny local model: advantages, logs, evaluation, checkpoints, model card."""

from __future__ import annotations

import glob
import math
import os

import helpers
import pandas as pd
import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset
from transformers import TrainerCallback

from riskpo_trl import (
    RiskPOConfig,
    RiskPOTrainer,
    authors_code_mvar_advantage,
    group_quantiles,
    job,
    leave_one_out_baseline,
    mvar_advantage,
    risk_seeking_advantage,
)
from riskpo_trl.trainer.riskpo_trainer import RISK_STATE_FILE

RISK_METRICS = [
    "risk/q_alpha",
    "risk/q_beta",
    "risk/bundle_score_mean",
    "risk/mvar",
    "risk/frac_unscorable",
    "risk/frac_zero_advantage",
]


def tiny_config(output_dir, **overrides) -> RiskPOConfig:
    """A short run: one generation batch per optimizer step (the paper's 4 updates per batch is tested apart)."""
    settings = dict(
        output_dir=str(output_dir),
        max_steps=3,
        max_completion_length=16,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-3,
        gradient_checkpointing=False,
        seed=7,
    )
    settings.update(overrides)
    settings.setdefault("steps_per_generation", settings.get("gradient_accumulation_steps", 5))
    return helpers.tiny_config(settings.pop("output_dir"), run=False, **settings)


class RecordBatches(TrainerCallback):
    """Keeps, per optimizer step, the trainer's tracker values and the latest batch's advantages (the batches reach
    it as a batch observer)."""

    def __init__(self):
        self.trainer = None
        self.latest = None
        self.steps: dict[int, dict] = {}

    def observe(self, scored):
        self.latest = scored.risk

    def on_step_end(self, args, state, control, **kwargs):
        batch = self.latest
        self.steps[state.global_step] = {
            "tracker": self.trainer.quantile_tracker.values.clone(),
            "advantages": batch.advantages.clone(),
            "bundle_ids": batch.bundle_ids.clone(),
        }


def make_trainer(tiny_model_dir, args, reward=contains_digit_reward, dataset=None, **kwargs) -> RiskPOTrainer:
    recorder = RecordBatches()
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset or make_prompt_dataset(),
        callbacks=[recorder],
        **kwargs,
    )
    recorder.trainer = trainer
    trainer.add_batch_observer(recorder.observe)
    trainer.recorder = recorder
    return trainer


class CaptureOutputs:
    """A batch observer that keeps exactly what reaches the loss, the risk step's result and the rewards."""

    def __init__(self, trainer: RiskPOTrainer):
        self.outputs, self.batches, self.trackers, self.rewards = [], [], [], []

        def observe(scored):
            self.outputs.append(scored.outputs)
            self.batches.append(scored.risk)
            self.trackers.append(trainer.quantile_tracker.values.clone())
            self.rewards.append(scored.rewards_per_func.clone())

        trainer.add_batch_observer(observe)


def test_training_logs_risk_metrics_and_feeds_riskpo_advantages(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_config(tmp_path, log_completions=True, advantage_baseline="none"))
    capture = CaptureOutputs(trainer)
    trainer.train()

    logs = [entry for entry in trainer.state.log_history if "risk/q_alpha" in entry]
    assert len(logs) == 3
    for entry in logs:
        for name in RISK_METRICS + ["entropy", "reward", "loss"]:
            assert name in entry, name
        assert entry["risk/q_alpha"] <= entry["risk/q_beta"]
        assert math.isfinite(entry["loss"])
    assert trainer.quantile_tracker.num_updates == 3

    # The advantages handed to the loss are MVaR advantages of the bundle scores, computed with the quantiles
    # after this batch's tracker update.
    for output, batch, tracker in zip(capture.outputs, capture.batches, capture.trackers):
        q_alpha, q_beta = tracker.tolist()
        assert (batch.q_alpha, batch.q_beta) == (q_alpha, q_beta)
        expected = mvar_advantage(batch.bundle_scores.double(), q_alpha, q_beta, 0.5)[batch.bundle_ids].float()
        assert torch.allclose(output["advantages"], expected)
        assert (output["advantages"] <= 0).all()

    # The completions table shows RiskPO's advantages and each completion's bundle.
    tables = sorted(glob.glob(os.path.join(tmp_path, "completions", "*.parquet")))
    assert tables
    table = pd.read_parquet(tables[-1])
    last = capture.batches[-1]
    assert table["advantage"].tolist() == pytest.approx(last.advantages.tolist())
    assert table["bundle"].tolist() == last.bundle_ids.tolist()


def test_leave_one_out_baseline_reaches_the_loss_and_the_logs(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_config(tmp_path, max_steps=2, advantage_baseline="loo"))
    capture = CaptureOutputs(trainer)
    trainer.train()
    for output, batch, tracker in zip(capture.outputs, capture.batches, capture.trackers):
        q_alpha, q_beta = tracker.tolist()
        paper = mvar_advantage(batch.bundle_scores.double(), q_alpha, q_beta, 0.5)[batch.bundle_ids]
        expected = leave_one_out_baseline(paper, ~torch.isnan(batch.rewards), trainer.num_generations).float()
        assert torch.allclose(output["advantages"], expected, atol=1e-6)
    logs = [entry for entry in trainer.state.log_history if "risk/frac_positive_advantage" in entry]
    assert len(logs) == 2
    pushed_up = [(batch.advantages > 1e-6).float().mean().item() for batch in capture.batches]
    assert [entry["risk/frac_positive_advantage"] for entry in logs] == pytest.approx(pushed_up)


@pytest.mark.slow
def test_default_config_trains_on_one_process_with_four_updates_per_generation_batch(tiny_model_dir, tmp_path):
    args = helpers.tiny_config(tmp_path, run=False, num_train_epochs=1, max_completion_length=32)
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=args,
        train_dataset=make_prompt_dataset(num_prompts=20),
    )
    trainer.train()
    # 20 prompts = one generation batch (4 x 5 micro-batches of 10 completions), taken in 4 optimizer steps
    assert trainer.state.global_step == 4
    assert trainer.quantile_tracker.num_updates == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {"risk_profile": "risk_seeking", "advantage_baseline": "none"},
        {"quantile_source": "batch"},
        {"bundle_size": 1},
        {"quantile_source": "group", "advantage_scaling": "authors_code", "risk_omega": 1.5},
        {"risk_profile": "rvar", "risk_alpha": 0.0},
        {"num_generations": 4, "bundle_size": 2, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1},
    ],
)
def test_profiles_and_layouts_train(tiny_model_dir, tmp_path, overrides):
    trainer = make_trainer(tiny_model_dir, tiny_config(tmp_path, max_steps=2, **overrides))
    capture = CaptureOutputs(trainer)
    trainer.train()
    for output, batch in zip(capture.outputs, capture.batches):
        assert not torch.isnan(output["advantages"]).any()
        if overrides.get("risk_profile") == "risk_seeking":
            expected = risk_seeking_advantage(batch.bundle_scores.double(), batch.q_alpha, batch.q_beta, 0.5)
            assert torch.allclose(output["advantages"], expected[batch.bundle_ids].float())
        if overrides.get("quantile_source") == "batch":
            scores = batch.bundle_scores.double()
            assert batch.q_alpha == pytest.approx(torch.quantile(scores, 0.2).item())
        if overrides.get("advantage_scaling") == "authors_code":
            q = group_quantiles(batch.bundle_scores, 10, [0.2, 0.8])
            assert torch.equal(batch.q_alpha, q[:, 0]) and torch.equal(batch.q_beta, q[:, 1])
            expected = authors_code_mvar_advantage(
                batch.bundle_scores.double(), q[:, 0], q[:, 1], 1.5, alpha=0.2, beta=0.8, num_generations=10
            )
            assert torch.allclose(output["advantages"], expected[batch.bundle_ids].float())
        if overrides.get("bundle_size") == 1:
            assert batch.bundle_scores.numel() == output["advantages"].numel()


def none_for_first_prompt_reward(completions, solution, **kwargs):
    """Unscorable (None) for every completion of the prompt whose solution is '0', else the digit reward."""
    rewards = contains_digit_reward(completions)
    return [None if s == "0" else r for r, s in zip(rewards, solution)]


@pytest.mark.slow
@pytest.mark.parametrize("advantage_baseline", ["none", "loo"])
def test_unscorable_prompts_get_zero_advantage_and_never_nan(tiny_model_dir, tmp_path, advantage_baseline):
    dataset = make_prompt_dataset(num_prompts=5)  # one generation batch: prompt "0 + 0" is always in it
    args = tiny_config(tmp_path, max_steps=2, advantage_baseline=advantage_baseline)
    trainer = make_trainer(tiny_model_dir, args, reward=none_for_first_prompt_reward, dataset=dataset)
    capture = CaptureOutputs(trainer)
    trainer.train()
    for output, batch, rewards in zip(capture.outputs, capture.batches, capture.rewards):
        advantages = output["advantages"]
        unscorable = torch.isnan(rewards[:, 0])
        assert unscorable.sum() == 10  # the 10 completions of prompt "0 + 0"
        assert not torch.isnan(advantages).any()
        assert (advantages[unscorable] == 0).all()
        assert torch.isfinite(batch.bundle_scores).all()  # the other 4 prompts still score every bundle
        scorable = ~unscorable
        expected = mvar_advantage(batch.bundle_scores.double(), batch.q_alpha, batch.q_beta, 0.5)[batch.bundle_ids]
        expected = torch.where(scorable, expected, torch.zeros_like(expected))
        if advantage_baseline == "loo":
            expected = leave_one_out_baseline(expected, scorable, 10)
        assert torch.allclose(advantages[scorable], expected[scorable].float(), atol=1e-6)


@pytest.mark.slow
def test_evaluation_never_moves_the_trackers_and_takes_a_partial_last_batch(tiny_model_dir, tmp_path):
    # 7 evaluation prompts in batches of 5 (50 completions / 10): the last batch holds 2 prompts, fewer than B=5.
    args = tiny_config(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=50)
    trainer = make_trainer(tiny_model_dir, args, eval_dataset=make_prompt_dataset(num_prompts=7))
    trainer.train()  # evaluates after each step
    assert sum("eval_risk/mvar" in entry for entry in trainer.state.log_history) == 2
    before = trainer.quantile_tracker.state_dict()
    metrics = trainer.evaluate()
    assert trainer.quantile_tracker.state_dict() == before
    assert "eval_risk/mvar" in metrics and "eval_risk/q_alpha" in metrics
    assert metrics["eval_risk/q_alpha"] == pytest.approx(before["values"][0])
    assert math.isfinite(metrics["eval_loss"])


def test_resume_restores_trackers_and_reproduces_advantages(tiny_model_dir, tmp_path):
    args = tiny_config(tmp_path / "full", max_steps=4, save_strategy="steps", save_steps=2)
    full = make_trainer(tiny_model_dir, args)
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / RISK_STATE_FILE).exists()

    resumed = make_trainer(tiny_model_dir, tiny_config(tmp_path / "resumed", max_steps=4, save_strategy="no"))
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for step in (3, 4):
        original, again = full.recorder.steps[step], resumed.recorder.steps[step]
        assert torch.equal(original["tracker"], again["tracker"]), step
        assert torch.equal(original["bundle_ids"], again["bundle_ids"]), step
        assert torch.equal(original["advantages"], again["advantages"]), step

    # A checkpoint without tracker state cannot be resumed silently.
    (checkpoint / RISK_STATE_FILE).unlink()
    broken = make_trainer(tiny_model_dir, tiny_config(tmp_path / "broken", max_steps=4))
    with pytest.raises(FileNotFoundError, match=RISK_STATE_FILE):
        broken.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.slow
def test_model_card_names_riskpo(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_config(tmp_path, max_steps=1))
    trainer.train()
    trainer.save_model()
    trainer.create_model_card(model_name="tiny-riskpo")
    card = (tmp_path / "README.md").read_text()
    assert "RiskPO" in card
    assert "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training" in card
    assert "2510.00911" in card and "ren2025riskpo" in card
    assert "riskpo" in card.split("---")[1]  # tags in the YAML header


def test_rejects_a_plain_grpo_config(tiny_model_dir, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="RiskPOConfig"):
        RiskPOTrainer(
            tiny_model_dir,
            reward_funcs=contains_digit_reward,
            args=GRPOConfig(output_dir=str(tmp_path), bf16=False, num_generations=2, per_device_train_batch_size=2),
            train_dataset=make_prompt_dataset(),
        )


def test_dataset_columns_are_checked_before_the_model_loads(tmp_path):
    from datasets import Dataset

    from riskpo_trl.rewards import math_verify_reward

    args = tiny_config(tmp_path)
    no_prompt = Dataset.from_list([{"question": "1 + 1", "solution": "2"}] * 5)
    # The model path does not exist: the dataset error must come first, before anything is loaded.
    with pytest.raises(ValueError, match=r"training dataset has no 'prompt' column \(its columns: \['question', "):
        job.build(
            RiskPOTrainer,
            str(tmp_path / "no-model"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=no_prompt,
        )
    no_solution = make_prompt_dataset().remove_columns("solution")
    with pytest.raises(ValueError, match=r"math_verify_reward reads the column\(s\) \['solution'\]"):
        job.build(
            RiskPOTrainer,
            str(tmp_path / "no-model"),
            reward_funcs=[contains_digit_reward, math_verify_reward],
            args=args,
            train_dataset=no_solution,
        )
    with pytest.raises(ValueError, match=r"evaluation \(held_out\) dataset has no 'prompt' column"):
        job.build(
            RiskPOTrainer,
            str(tmp_path / "no-model"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=make_prompt_dataset(),
            eval_dataset={"held_out": no_prompt},
        )


def never_scorable_reward(completions, **kwargs):
    return [None] * len(completions)


@pytest.mark.slow
def test_a_run_whose_rewards_never_score_stops_with_an_error(tiny_model_dir, tmp_path):
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=never_scorable_reward,
        train_dataset=make_prompt_dataset(),
        args=tiny_config(tmp_path, max_steps=5, max_unscorable_batches=2),
    )
    with pytest.raises(RuntimeError, match="No completion could be scored in the last 2 training batches"):
        trainer.train()
    assert trainer.state.global_step == 1  # stopped while preparing the second batch
    logged = [entry for entry in trainer.state.log_history if "risk/frac_unscorable" in entry]
    assert logged and logged[0]["risk/frac_unscorable"] == 1.0
    assert "risk/upper_rvar" not in logged[0] and "risk/lower_rvar" not in logged[0]  # no bundle scored at all


class FailingSandboxReward:
    """A reward whose own machinery failed on every completion (as `CodeReward` reports a sandbox fault)."""

    def __call__(self, completions, **kwargs):
        return [None] * len(completions)

    def unscorable_causes(self):
        return "writing a run's spec file: no space left (8 completion(s))"


def test_the_nothing_scorable_stop_names_the_sandbox_cause_when_that_is_the_reason():
    """With the job layer's reward accounting (its counts on the trainer), the stop says why; without it, only that
    nothing was scored."""
    from types import SimpleNamespace

    from riskpo_trl.job.reward_accounting import UnscoredCounts

    batch = SimpleNamespace(unscorable=torch.ones(8, dtype=torch.bool))
    trainer = SimpleNamespace(
        _unscorable_batches=0,
        args=SimpleNamespace(max_unscorable_batches=1),
        unscored_counts=UnscoredCounts(["contains_digit_reward", "code_reward"], none=[8, 8]),
        reward_funcs=[contains_digit_reward, FailingSandboxReward()],
    )
    with pytest.raises(RuntimeError, match=r"machinery failed, not the data: code_reward: writing a run's spec file"):
        RiskPOTrainer._stop_if_nothing_is_scorable(trainer, batch)
    trainer.reward_funcs = [contains_digit_reward, never_scorable_reward]  # no machinery cause: the data's message
    with pytest.raises(
        RuntimeError, match=r"contains_digit_reward: 8 None; code_reward: 8 None.*Check that the reward"
    ):
        RiskPOTrainer._stop_if_nothing_is_scorable(trainer, batch)
    trainer.unscored_counts = None  # a trainer built without the job layer
    with pytest.raises(RuntimeError, match=r"batches: no reward function scored any completion\. Set max_unscorable"):
        RiskPOTrainer._stop_if_nothing_is_scorable(trainer, batch)


@pytest.mark.slow  # a tiny model's training on a full disk
def test_a_checkpoint_on_a_full_disk_names_its_path_and_cause(tiny_model_dir, tmp_path):
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        trainer = job.build(
            RiskPOTrainer,
            tiny_model_dir,
            reward_funcs=contains_digit_reward,
            train_dataset=make_prompt_dataset(),
            args=tiny_config(disk / "run", max_steps=1, save_strategy="steps", save_steps=1),
        )
        with pytest.raises(OSError, match=r"Could not write a checkpoint in .*disk/run: .*Free space there"):
            trainer.train()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
