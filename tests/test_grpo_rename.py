"""A TRL script that renames GRPOConfig/GRPOTrainer to RiskPOConfig/RiskPOTrainer hears once, when the trainer is
built, which of GRPO's defaults the paper's layout replaced, with the way to keep GRPO's; nothing is said for fields
it set, for a config from RiskPOConfig.from_grpo_config, or for riskpo-train's recipes (they state their layout)."""

from __future__ import annotations

import logging
from pathlib import Path

from helpers import contains_digit_reward, make_prompt_dataset
from trl import GRPOConfig

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.scripts import train

TINY_RECIPE = Path(__file__).resolve().parents[1] / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
PAPER_LAYOUT = "left these at the paper's layout, not GRPOConfig's defaults"


def build(model, args, caplog) -> list[str]:
    with caplog.at_level(logging.WARNING):
        RiskPOTrainer(model, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(40))
    return [record.getMessage() for record in caplog.records if PAPER_LAYOUT in record.getMessage()]


def test_a_renamed_grpo_script_hears_the_replaced_defaults_once(tiny_model_dir, tmp_path, caplog):
    args = RiskPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    [line] = build(tiny_model_dir, args, caplog)
    grpo = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    for name in (
        "gradient_accumulation_steps",
        "steps_per_generation",
        "generation_batch_size",
        "temperature",
        "importance_sampling_level",
        "loss_type",
        "num_generations",
        "per_device_train_batch_size",
    ):
        assert f"{name}={getattr(args, name)!r} (GRPOConfig: {getattr(grpo, name)!r})" in line, name
    assert "RiskPOConfig.from_grpo_config(GRPOConfig(...), bundle_size=...)" in line


def test_fields_the_script_set_are_not_named(tiny_model_dir, tmp_path, caplog):
    args = RiskPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        gradient_accumulation_steps=1,
        steps_per_generation=5,
        temperature=0.8,
        importance_sampling_level="sequence",
        loss_type="grpo",
        num_generations=10,
        per_device_train_batch_size=10,
        per_device_eval_batch_size=50,
    )
    assert build(tiny_model_dir, args, caplog) == []


def test_from_grpo_config_and_the_cli_say_nothing(tiny_model_dir, tmp_path, caplog):
    grpo = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
    )
    assert build(tiny_model_dir, RiskPOConfig.from_grpo_config(grpo, bundle_size=2), caplog) == []
    caplog.clear()
    _, training_args, _ = train.parse_args(["--config", str(TINY_RECIPE), "--output_dir", str(tmp_path / "cli")])
    assert build(tiny_model_dir, training_args, caplog) == []


def test_the_replaced_defaults_warning_is_wrapped_without_splitting_a_setting(tmp_path, caplog):
    import logging

    from riskpo_trl.trainer.caller_warnings import WARNING_WIDTH, replaced_grpo_defaults, warn_replaced_grpo_defaults

    args = RiskPOConfig(output_dir=str(tmp_path), use_cpu=True)
    with caplog.at_level(logging.WARNING):
        warn_replaced_grpo_defaults(args, logging.getLogger("riskpo_test"))
    [message] = [record.getMessage() for record in caplog.records if record.name == "riskpo_test"]
    assert all(len(line) <= WARNING_WIDTH for line in message.splitlines()), message
    assert all(setting in message.splitlines()[1] or setting in message for setting in replaced_grpo_defaults(args))
    assert len(message.splitlines()) > 3
