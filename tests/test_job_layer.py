"""Every trainer a recipe can name is built by the same job layer (riskpo_trl.job): the baselines are TRL's own
classes, and the checks and guard rails below apply to RiskPO and to the GRPO and GMPO baselines alike. A trainer
built directly is GRPOTrainer plus RiskPO: the job's guard rails are not part of it."""

from __future__ import annotations

import logging
import math
import os

import pytest
from helpers import TINY_RUN, contains_digit_reward, make_prompt_dataset
from peft import LoraConfig

from riskpo_trl import job
from riskpo_trl.job.guard_rails import RequireAStep
from riskpo_trl.job.resumed_schedule import ResumedScheduleCallback
from riskpo_trl.trainer.batch_hook import BatchObserversMixin
from riskpo_trl.trainer.registry import TRAINERS, get_trainer_classes

# The tests' tiny run for any trainer of the registry (bundle_size is RiskPO's own).
SETTINGS = {name: value for name, value in TINY_RUN.items() if name != "bundle_size"}
SETTINGS.update(num_generations=2, gradient_checkpointing=False, seed=3)


def nan_for_first_completions(completions, **kwargs):
    """NaN for each prompt's first completion (every other one), else the digit reward."""
    rewards = contains_digit_reward(completions)
    return [math.nan if i % 2 == 0 else r for i, r in enumerate(rewards)]


def build(name: str, output_dir, model, **kwargs):
    config_class, trainer_class = get_trainer_classes(name)
    risk = {"bundle_size": 2} if name == "riskpo" else {}
    args = config_class(output_dir=str(output_dir), **SETTINGS, **risk)
    return job.build(
        trainer_class,
        model,
        reward_funcs=kwargs.pop("reward_funcs", contains_digit_reward),
        args=args,
        train_dataset=make_prompt_dataset(8),
        **kwargs,
    )


def test_the_baselines_are_trls_own_classes_and_only_riskpo_overrides_the_rewards():
    import trl
    from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

    from riskpo_trl import RiskPOConfig, RiskPOTrainer

    assert get_trainer_classes("grpo") == (trl.GRPOConfig, trl.GRPOTrainer)
    assert get_trainer_classes("gmpo") == (GMPOConfig, GMPOTrainer)
    assert get_trainer_classes("riskpo") == (RiskPOConfig, RiskPOTrainer)
    for name in TRAINERS:
        _, trainer_class = get_trainer_classes(name)
        overriding = [
            cls
            for cls in trainer_class.__mro__
            if "_calculate_rewards" in vars(cls) and cls.__module__.startswith("riskpo_trl")
        ]
        assert overriding == ([BatchObserversMixin] if name == "riskpo" else []), name


def test_a_study_observes_a_baseline_s_batches_through_one_class_per_baseline():
    import trl

    from riskpo_trl.trainer.observed import observed_trainer

    observed = observed_trainer(trl.GRPOTrainer)
    assert observed is observed_trainer(trl.GRPOTrainer) and issubclass(observed, trl.GRPOTrainer)
    assert observed.__name__ == "GRPOTrainer" and callable(observed.add_batch_observer)
    assert BatchObserversMixin in observed.__mro__ and not hasattr(trl.GRPOTrainer, "add_batch_observer")


@pytest.mark.parametrize("name", list(TRAINERS))
def test_the_start_up_checks_apply_to_every_trainer(name, tiny_model_dir, tmp_path):
    trainer_class = get_trainer_classes(name)[1].__name__
    with pytest.raises(
        TypeError,
        match=rf"{trainer_class} got an unexpected keyword argument 'train_datset' "
        r"\(did you mean train_dataset\?\)",
    ):
        build(name, tmp_path, tiny_model_dir, train_datset=make_prompt_dataset(8))
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        build(name, tmp_path, str(tmp_path / "no-such-model"))


@pytest.mark.parametrize("name", list(TRAINERS))
def test_the_guard_rails_apply_to_every_trainer(name, tiny_model_dir, tmp_path, monkeypatch, caplog):
    """An adapter on a relative model path records it absolute; the resumed-schedule and one-step callbacks are
    installed once; the card is the run's; one training step trains, naming the reward function returning NaN (the
    reward accounting, on the trainer object of every class). RiskPO's batches reach a batch observer with the
    gathered rewards (TRL's baselines have none)."""
    monkeypatch.chdir(os.path.dirname(tiny_model_dir))
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = build(
        name,
        tmp_path,
        os.path.basename(tiny_model_dir),
        peft_config=lora,
        reward_funcs=[contains_digit_reward, nan_for_first_completions],
    )
    assert job.prepare(trainer) is trainer  # once: a second call adds nothing
    assert trainer.model.peft_config["default"].base_model_name_or_path == tiny_model_dir
    for callback_class in (ResumedScheduleCallback, RequireAStep):
        callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, callback_class)]
        assert len(callbacks) == 1, callback_class

    seen = []
    if name == "riskpo":
        trainer.add_batch_observer(lambda batch: seen.append((batch.mode, batch.rewards_per_func.shape)))
    else:
        assert not hasattr(trainer, "add_batch_observer")
    with caplog.at_level(logging.WARNING):
        job.train(trainer)
    assert trainer.state.global_step == 1
    trainer.create_model_card()
    assert "| reward function | weight |" in (tmp_path / "README.md").read_text()  # the run's card, a baseline's too
    assert seen == ([("train", (8, 2))] if name == "riskpo" else [])
    assert trainer.unscored_counts.nan == [0, 4]  # one of each prompt's 2 completions
    assert "Reward function nan_for_first_completions returned NaN for 4 of 8 completions" in caplog.text
    assert "returned None" not in caplog.text  # TRL's own warning, which says None for NaN, held back
    assert trainer.reward_funcs[1] is nan_for_first_completions  # the user's own function again after the batch


def test_a_trainer_built_directly_gets_no_guard_rail(tiny_model_dir, tmp_path):
    """GRPOTrainer plus RiskPO: no job callback, TRL's own model card writer, no start-up check of its own."""
    from riskpo_trl import RiskPOConfig, RiskPOTrainer

    args = RiskPOConfig(output_dir=str(tmp_path), **SETTINGS, bundle_size=2)
    trainer = RiskPOTrainer(
        tiny_model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(8)
    )
    assert not any(isinstance(c, (ResumedScheduleCallback, RequireAStep)) for c in trainer.callback_handler.callbacks)
    wrapped = ("create_model_card", "_calculate_rewards", "_save_checkpoint", "_load_optimizer_and_scheduler")
    assert not set(wrapped) & set(vars(trainer))


def test_without_args_riskpo_takes_its_configs_defaults(tiny_model_dir, tmp_path, monkeypatch):
    """RiskPOTrainer builds its own default config, as GRPOTrainer does (the baselines' GRPOConfig defaults to bf16,
    which a CPU refuses); so does the job layer."""
    monkeypatch.chdir(tmp_path)
    config_class, trainer_class = get_trainer_classes("riskpo")
    trainer = trainer_class(tiny_model_dir, reward_funcs=contains_digit_reward, train_dataset=make_prompt_dataset(20))
    assert type(trainer.args) is config_class and trainer.risk_estimator.bundle_size == 5
    assert trainer.args.output_dir == f"{os.path.basename(tiny_model_dir)}-RiskPO"
    built = job.build(
        trainer_class, tiny_model_dir, reward_funcs=contains_digit_reward, train_dataset=make_prompt_dataset(20)
    )
    assert type(built.args) is config_class and built.args.output_dir == trainer.args.output_dir


def test_the_token_mean_acts_where_its_field_is_riskpo_only():
    """verl's token mean reads RiskPOConfig's loss_token_mean_sequences, so it is RiskPOTrainer's alone."""
    from riskpo_trl.trainer.token_mean import TokenMeanLossMixin

    for name in TRAINERS:
        config_class, trainer_class = get_trainer_classes(name)
        has_field = "loss_token_mean_sequences" in config_class.__dataclass_fields__
        assert issubclass(trainer_class, TokenMeanLossMixin) == has_field, name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "gmpo"])
def test_trls_own_baselines_train_resume_and_evaluate_through_riskpo_train(name, tmp_path):
    """The tiny GRPO recipe, as TRL's GRPOTrainer and as GMPOTrainer: two steps with a checkpoint each, the same
    command with max_steps 3 resumes from checkpoint-2, the card is the run's, and riskpo-eval scores the output."""
    from pathlib import Path

    import trl

    from riskpo_trl.scripts import eval as eval_script
    from riskpo_trl.scripts import train

    root = Path(__file__).resolve().parents[1]

    def command(max_steps: str) -> list[str]:
        return [
            "--config",
            str(root / "recipes/tiny/grpo/config_tiny_arithmetic.yaml"),
            "--trainer",
            name,
            "--model_name_or_path",
            str(tmp_path / "tiny-model"),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(root / "examples/data/tiny_arithmetic.jsonl"),
            "--max_completion_length",
            "8",
            "--max_steps",
            max_steps,
            "--save_steps",
            "1",
        ]

    first = train.main(*train.parse_args(command("2")))
    assert isinstance(first, trl.GRPOTrainer) and type(first).__module__.startswith("trl.")
    second = train.main(*train.parse_args(command("3")))
    assert second.state.global_step == 3
    steps = [entry["step"] for entry in second.state.log_history if "loss" in entry]
    assert steps == [1, 2, 3]  # steps 1-2 restored from checkpoint-2, step 3 trained
    assert "| reward function | weight |" in (tmp_path / "run" / "README.md").read_text()
    results = eval_script.main(
        [
            "--model",
            str(tmp_path / "run"),
            "--dataset_files",
            str(root / "tests/data/toy_math.jsonl"),
            "--num_samples",
            "2",
            "--max_new_tokens",
            "4",
            "--max_problems",
            "2",
            "--backend",
            "transformers",
            "--output_dir",
            str(tmp_path / "eval"),
        ]
    )
    assert results["benchmarks"]["toy_math"]["num_scored"] == 2
