"""RiskPOConfig.from_grpo_config: a GRPO user's config carried over whole, tokens and batch layout included."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from helpers import contains_digit_reward, make_prompt_dataset
from trl import GRPOConfig

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.risk.defaults import resolve_advantage_baseline


def grpo_config(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=3e-6,
        temperature=0.7,
        hub_token="hf_not_a_real_token",
        hub_model_id="someone/tiny-grpo",
        lr_scheduler_kwargs={"min_lr": 0.0},
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def test_plain_to_dict_round_trip_fails_which_is_why_the_method_exists(tmp_path):
    with pytest.raises(ValueError, match="generation_batch_size"):
        RiskPOConfig(**grpo_config(tmp_path).to_dict())


def test_from_grpo_config_keeps_every_setting_and_the_token(tmp_path):
    source = grpo_config(tmp_path)
    config = RiskPOConfig.from_grpo_config(source, bundle_size=4, risk_omega=1.0)
    assert config.bundle_size == 4 and config.risk_omega == 1.0
    assert config.hub_token == "hf_not_a_real_token"  # to_dict() would have masked it as "<HUB_TOKEN>"
    differing = {
        f.name for f in dataclasses.fields(GRPOConfig) if f.init and getattr(config, f.name) != getattr(source, f.name)
    }
    assert differing == set()
    assert (config.generation_batch_size, config.steps_per_generation) == (16, 2)


def test_batch_fields_are_derived_again_from_the_new_layout(tmp_path):
    config = RiskPOConfig.from_grpo_config(grpo_config(tmp_path), per_device_train_batch_size=4, bundle_size=2)
    assert (config.steps_per_generation, config.generation_batch_size) == (2, 8)


def test_grpo_generation_schedule_carries_over_not_the_papers(tmp_path):
    # RiskPOConfig's own default is 4 updates per generation batch; a converted GRPO config keeps GRPO's one.
    assert (
        RiskPOConfig(
            **{
                **grpo_config(tmp_path).to_dict(),
                "hub_token": None,
                "bundle_size": 4,
                "generation_batch_size": None,
                "steps_per_generation": None,
            }
        ).steps_per_generation
        == 8
    )
    config = RiskPOConfig.from_grpo_config(grpo_config(tmp_path), gradient_accumulation_steps=4, bundle_size=4)
    assert (config.steps_per_generation, config.generation_batch_size) == (4, 32)


def test_a_chosen_generation_batch_carries_over(tmp_path):
    source = grpo_config(tmp_path, generation_batch_size=32)  # steps_per_generation 4, not the default 2
    assert RiskPOConfig.from_grpo_config(source, bundle_size=4).generation_batch_size == 32
    # Naming either field of the pair replaces the source's choice.
    assert RiskPOConfig.from_grpo_config(source, bundle_size=2, steps_per_generation=1).generation_batch_size == 8


def test_from_grpo_config_gets_the_default_baseline_or_the_authors_none(tmp_path):
    default = RiskPOConfig.from_grpo_config(grpo_config(tmp_path), bundle_size=4)
    assert resolve_advantage_baseline(default.advantage_baseline, default.advantage_scaling) == "loo"
    paper = RiskPOConfig.from_grpo_config(grpo_config(tmp_path), bundle_size=4, advantage_baseline="none")
    assert paper.advantage_baseline == "none"
    authors = RiskPOConfig.from_grpo_config(
        grpo_config(tmp_path),
        bundle_size=4,
        advantage_scaling="authors_code",
        quantile_source="group",
        credit_assignment="sum_mean",
    )
    assert resolve_advantage_baseline(authors.advantage_baseline, authors.advantage_scaling) == "none"


def test_unknown_risk_field_is_named_with_the_closest_field(tmp_path):
    with pytest.raises(TypeError, match=r"'bundel_size' \(did you mean bundle_size\?\)"):
        RiskPOConfig.from_grpo_config(grpo_config(tmp_path), bundel_size=4)


def test_trainer_error_names_from_grpo_config_and_that_call_works(tiny_model_dir, tmp_path):
    source = grpo_config(tmp_path)
    with pytest.raises(TypeError, match=r"RiskPOConfig\.from_grpo_config\(your_config, bundle_size="):
        RiskPOTrainer(
            tiny_model_dir, reward_funcs=contains_digit_reward, args=source, train_dataset=make_prompt_dataset()
        )
    trainer = RiskPOTrainer(
        tiny_model_dir,
        reward_funcs=contains_digit_reward,
        args=RiskPOConfig.from_grpo_config(source, bundle_size=4),
        train_dataset=make_prompt_dataset(),
    )
    assert trainer.args.bundle_size == 4 and trainer.args.hub_model_id == "someone/tiny-grpo"


def test_one_line_names_the_carried_over_settings_that_differ_from_the_papers(tmp_path, caplog):
    source = grpo_config(tmp_path, beta=0.04)  # GRPO's token ratio, loss_type="dapo"; temperature 0.7, beta 0.04 set
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.trainer.config_conversion"):
        RiskPOConfig.from_grpo_config(source, bundle_size=4, num_generations=4)
    [record] = [r for r in caplog.records if "from_grpo_config" in r.getMessage()]
    assert record.getMessage() == (
        "RiskPOConfig.from_grpo_config kept the GRPO config's importance_sampling_level='token' (paper: 'sequence'), "
        "loss_type='dapo' (paper: 'grpo'), temperature=0.7 (paper: 0.8), beta=0.04 (paper: 0.0), 1 optimizer "
        "update(s) per generation batch (steps_per_generation=2; paper: 4) and uses advantage_baseline='loo' (the "
        "library's default; paper: 'none'); pass any of them to from_grpo_config to use the paper's."
    )  # num_generations=4 was passed on purpose: not named
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.trainer.config_conversion"):
        RiskPOConfig.from_grpo_config(
            source,
            bundle_size=2,
            num_generations=10,
            importance_sampling_level="sequence",
            loss_type="grpo",
            temperature=0.8,
            beta=0.0,
            steps_per_generation=8,
            per_device_train_batch_size=10,
            advantage_baseline="none",
        )
    assert "from_grpo_config" not in caplog.text  # the paper's settings: nothing to say


def test_the_default_baseline_alone_is_named_as_not_the_papers(tmp_path, caplog):
    paper_grpo = grpo_config(
        tmp_path,
        importance_sampling_level="sequence",
        loss_type="grpo",
        temperature=0.8,
        num_generations=10,
        per_device_train_batch_size=10,
        steps_per_generation=8,
    )
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.trainer.config_conversion"):
        RiskPOConfig.from_grpo_config(paper_grpo, bundle_size=2)
    [record] = [r for r in caplog.records if "from_grpo_config" in r.getMessage()]
    assert record.getMessage() == (
        "RiskPOConfig.from_grpo_config uses advantage_baseline='loo' (the library's default; paper: 'none'); pass any "
        "of them to from_grpo_config to use the paper's."
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.trainer.config_conversion"):
        RiskPOConfig.from_grpo_config(
            paper_grpo,
            bundle_size=2,
            advantage_scaling="authors_code",
            quantile_source="group",
            credit_assignment="sum_mean",
        )
    assert "from_grpo_config" not in caplog.text  # the authors' scaling resolves to the paper's 'none'
