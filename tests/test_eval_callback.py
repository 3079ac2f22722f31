"""PassAtKCallback inside a tiny RiskPOTrainer run: Pass@k lands in log_history at the right steps."""

from __future__ import annotations

import json

import helpers
import pytest
from helpers import contains_digit_reward, make_prompt_dataset

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.evaluation.callback import PassAtKCallback


def digit_scorer(completion: str, gold: str) -> float:
    """Same as the training reward, so the untrained tiny model gets a non-trivial Pass@k."""
    return float(any(ch.isdigit() for ch in completion))


def tiny_config(output_dir, max_steps: int) -> RiskPOConfig:
    return helpers.tiny_config(
        output_dir,
        run=False,
        max_steps=max_steps,
        max_completion_length=16,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        bundle_size=2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
    )


@pytest.mark.slow
def test_pass_at_k_is_logged_during_training(tiny_model_dir, tmp_path):
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=tiny_config(tmp_path, max_steps=3),
        train_dataset=make_prompt_dataset(8),
    )
    callback = PassAtKCallback(
        trainer, make_prompt_dataset(3), num_samples=4, ks=[1, 4], eval_steps=2, max_new_tokens=8, scorer=digit_scorer
    )
    trainer.add_callback(callback)
    trainer.train()

    curves = PassAtKCallback.curves(trainer.state.log_history)
    assert set(curves) == {"pass@1", "pass@4", "avg@4"}
    assert [step for step, _ in curves["pass@1"]] == [0, 2, 3]  # start, every 2 steps, end
    for (_, pass1), (_, pass4), (_, avg4) in zip(curves["pass@1"], curves["pass@4"], curves["avg@4"]):
        assert 0.0 <= pass1 <= pass4 <= 1.0
        assert pass1 == pytest.approx(avg4)
    assert any(value > 0 for _, value in curves["pass@4"])  # the digit scorer is met some of the time
    assert trainer.model.training  # evaluation put the model back in training mode
    assert any("risk/mvar" in entry for entry in trainer.state.log_history)  # training logs are untouched


def test_callback_rejects_bad_settings(tiny_model_dir, tmp_path):
    dataset = make_prompt_dataset(2)
    with pytest.raises(ValueError, match="num_samples=4"):
        PassAtKCallback(None, dataset, num_samples=4, ks=[8])
    with pytest.raises(ValueError, match="answer_column"):
        PassAtKCallback(None, dataset.remove_columns("solution"))
    with pytest.raises(ValueError, match="eval_steps"):
        PassAtKCallback(None, dataset, eval_steps=0)


@pytest.mark.slow
def test_steps_with_an_evaluation_keep_their_training_metrics(tiny_model_dir, tmp_path):
    """Evaluating at a logging step must not swallow that step's loss / learning rate / grad norm."""
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=tiny_config(tmp_path, max_steps=4),
        train_dataset=make_prompt_dataset(16),
    )
    trainer.add_callback(
        PassAtKCallback(
            trainer,
            make_prompt_dataset(2),
            num_samples=2,
            eval_steps=2,
            max_new_tokens=4,
            scorer=digit_scorer,
            eval_on_start=False,
        )
    )
    trainer.train()
    trainer.save_state()

    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    for key in ("loss", "learning_rate", "grad_norm"):
        assert sorted(entry["step"] for entry in history if key in entry) == [1, 2, 3, 4], key
    assert sorted(entry["step"] for entry in history if "eval/pass@1" in entry) == [2, 4]
