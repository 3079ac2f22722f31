"""A training set smaller than one generation batch would train 0 steps (TRL drops an incomplete generation batch):
it is refused at construction with both sizes and the settings that change them, and no run that took no step saves
a model card."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from datasets import IterableDataset
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config
from trl import GRPOConfig

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_GRPO_RECIPE = ROOT / "recipes/tiny/grpo/config_tiny_arithmetic.yaml"


def small_config(tmp_path, **overrides) -> RiskPOConfig:
    """4 prompts x 2 completions per generation batch, taken in 2 optimizer updates of 4 completions."""
    settings = dict(
        output_dir=str(tmp_path),
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        steps_per_generation=2,
        bundle_size=2,
        max_completion_length=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
    )
    return tiny_config(settings.pop("output_dir"), run=False, **{**settings, **overrides})


def test_a_grpo_script_swapped_to_riskpo_with_20_examples_is_refused_naming_the_sizes(tmp_path):
    """The newcomer's swap: GRPO-style batch settings, RiskPOConfig's four updates per generation batch."""
    args = tiny_config(tmp_path, run=False, per_device_train_batch_size=8, num_generations=4)
    with pytest.raises(ValueError) as error:
        # The model path does not exist: the size check comes before anything loads.
        job.build(
            RiskPOTrainer,
            str(tmp_path / "no-model"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=make_prompt_dataset(20),
        )
    message = str(error.value)
    assert "The training dataset has 20 examples, fewer than the 40 prompts one generation batch takes" in message
    for setting in (
        "generation_batch_size=160",
        "per_device_train_batch_size=8",
        "x 1 process x",
        "steps_per_generation=20",
        "num_generations=4",
        "gradient_accumulation_steps=5",
    ):
        assert setting in message
    assert "steps_per_generation=10 fits: 20 prompts per generation batch, taken in 2 optimizer updates" in message


def refusal(args, rows: int, model: str) -> str:
    with pytest.raises(ValueError) as error:
        job.build(
            RiskPOTrainer,
            model,
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=make_prompt_dataset(rows),
        )
    return str(error.value)


def test_the_refusal_names_from_grpo_config_and_its_one_line_example_trains_on_30_prompts(tiny_model_dir, tmp_path):
    """The 30-prompt GRPO script with only the names changed: the drop-in path is named, with a call that works."""
    message = refusal(
        tiny_config(tmp_path, run=False, per_device_train_batch_size=8, num_generations=4), 30, tiny_model_dir
    )
    assert "fewer than the 40 prompts" in message
    [example] = re.findall(r"args = (RiskPOConfig\.from_grpo_config\(.*?, bundle_size=\d+\))", message)
    assert example.endswith("bundle_size=2)")  # 8 completions per step / 4 = 2 prompts: bundles of 2
    # output_dir=... stands for the script's own settings; this machine has no bf16 accelerator.
    args = eval(
        example.replace("output_dir=...", "output_dir=OUT, use_cpu=True"),
        {"RiskPOConfig": RiskPOConfig, "GRPOConfig": GRPOConfig, "OUT": str(tmp_path)},
    )
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=args,
        train_dataset=make_prompt_dataset(30),
    )
    assert trainer.args.generation_batch_size // trainer.args.num_generations == 2


def test_with_5_prompts_no_steps_per_generation_fits_bundle_size_5_so_a_fitting_bundle_size_is_named(
    tiny_model_dir, tmp_path
):
    args = tiny_config(tmp_path, run=False, per_device_train_batch_size=8, num_generations=4)
    message = refusal(args, 5, tiny_model_dir)
    assert "No steps_per_generation fits bundle_size=5 with gradient_accumulation_steps=5 and 5 examples." in message
    [(steps, accumulation, bundle)] = re.findall(
        r"For example, steps_per_generation=(\d+), gradient_accumulation_steps=(\d+) and bundle_size=(\d+) fit",
        message,
    )
    assert int(bundle) != 5
    # What it names is accepted by the config and fits the 5 examples.
    fitted = tiny_config(
        tmp_path,
        run=False,
        per_device_train_batch_size=8,
        num_generations=4,
        steps_per_generation=int(steps),
        gradient_accumulation_steps=int(accumulation),
        bundle_size=int(bundle),
    )
    assert fitted.generation_batch_size // fitted.num_generations <= 5
    job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=fitted,
        train_dataset=make_prompt_dataset(5),
    )


@pytest.mark.slow
def test_exactly_one_generation_batch_trains_every_step_over_repeated_epochs(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="has 3 examples, fewer than the 4 prompts"):
        job.build(
            RiskPOTrainer,
            tiny_model_dir,
            reward_funcs=contains_digit_reward,
            args=small_config(tmp_path, max_steps=6),
            train_dataset=make_prompt_dataset(3),
        )
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=small_config(tmp_path, max_steps=6),
        train_dataset=make_prompt_dataset(4),
    )
    trainer.train()
    assert trainer.state.global_step == 6 and trainer.quantile_tracker.num_updates == 3
    assert trainer.state.epoch == pytest.approx(3.0)


@pytest.mark.slow
def test_a_stream_with_less_than_one_generation_batch_raises_after_training(tiny_model_dir, tmp_path):
    """An IterableDataset has no length to check at construction; a run that took no step raises and writes no
    card."""
    rows = make_prompt_dataset(3).to_list()
    stream = IterableDataset.from_generator(lambda: iter(rows))
    trainer = job.build(
        RiskPOTrainer,
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=small_config(tmp_path, max_steps=2),
        train_dataset=stream,
    )
    with pytest.raises(RuntimeError, match="Training ended without a single step.*fewer than the 4 prompts"):
        trainer.train()
    trainer.create_model_card()
    assert not (tmp_path / "README.md").exists()


@pytest.mark.parametrize("recipe", [TINY_RECIPE, TINY_GRPO_RECIPE], ids=["riskpo", "grpo"])
def test_the_script_refuses_too_few_examples_and_writes_no_card(tmp_path, capsys, recipe):
    with pytest.raises(SystemExit) as exit:
        train.cli(
            [
                "--config",
                str(recipe),
                "--model_name_or_path",
                str(tmp_path / "tiny"),
                "--output_dir",
                str(tmp_path / "run"),
                "--max_train_samples",
                "1",
                "--dataset_files",
                str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
            ]
        )
    assert exit.value.code == 2
    assert "The training dataset has 1 example, fewer than the 2 prompts" in capsys.readouterr().err
    assert not (tmp_path / "run" / "README.md").exists()
