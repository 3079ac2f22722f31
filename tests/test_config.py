"""RiskPOConfig: the paper's defaults and config-time validation."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from helpers import tiny_config
from transformers import HfArgumentParser

from riskpo_trl import RiskEstimator, RiskPOConfig


def test_defaults_are_the_papers_and_form_whole_bundle_groups(tmp_path):
    config = tiny_config(tmp_path, run=False)
    assert (config.risk_alpha, config.risk_beta, config.risk_omega, config.bundle_size) == (0.2, 0.8, 0.5, 5)
    assert (config.risk_profile, config.quantile_source, config.quantile_lr) == ("mvar", "tracked", 0.1)
    assert config.importance_sampling_level == "sequence" and config.loss_type == "grpo"
    assert (config.epsilon, config.beta, config.num_generations, config.temperature) == (0.2, 0.0, 10, 0.8)
    prompts = config.generation_batch_size // config.num_generations
    assert prompts % config.bundle_size == 0


def test_every_risk_field_is_documented_for_the_cli():
    help_text = HfArgumentParser(RiskPOConfig).format_help()
    for name in [
        "risk_alpha",
        "risk_beta",
        "risk_omega",
        "bundle_size",
        "risk_profile",
        "quantile_source",
        "quantile_lr",
        "quantile_lr_decay",
        "advantage_scaling",
        "natural_baseline",
        "credit_assignment",
        "bundling",
    ]:
        assert f"--{name}" in help_text
    assert "Mixing weight omega" in help_text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"risk_alpha": 0.8, "risk_beta": 0.2}, "0 <= risk_alpha < risk_beta <= 1"),
        ({"risk_alpha": -0.1}, "0 <= risk_alpha < risk_beta <= 1"),
        ({"risk_beta": 1.5}, "0 <= risk_alpha < risk_beta <= 1"),
        ({"risk_omega": -0.5}, "risk_omega=-0.5 must be >= 0"),
        ({"bundle_size": 0}, "bundle_size=0 must be >= 1"),
        ({"num_generations": 1}, "num_generations=1 must be >= 2"),
        ({"risk_profile": "mean"}, "risk_profile='mean' is unknown"),
        ({"quantile_source": "oracle"}, "quantile_source='oracle' is unknown"),
        ({"quantile_lr": 0.0}, "quantile_lr=0.0 must be > 0"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "leave it at 'sum_then_normalize'"),
        ({"advantage_scaling": "std"}, "advantage_scaling='std' is unknown"),
        ({"advantage_scaling": "authors_code", "risk_alpha": 0.0}, "risk_profile='mvar' needs risk_alpha > 0"),
        (
            {"advantage_scaling": "authors_code", "risk_profile": "risk_seeking", "risk_beta": 1.0},
            "risk_profile='risk_seeking' needs risk_beta < 1",
        ),
        (
            {"advantage_scaling": "authors_code", "risk_profile": "rvar"},
            "defined for risk_profile in ['mvar', 'risk_seeking'], not 'rvar'",
        ),
        ({"credit_assignment": "sum-mean"}, "credit_assignment='sum-mean' is unknown"),
        ({"bundling": "random"}, "bundling='random' is unknown"),
        ({"risk_profile": "risk_seeking", "natural_baseline": False}, "Leave natural_baseline at True"),
    ],
)
def test_bad_risk_fields_raise_naming_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_config(tmp_path, run=False, **overrides)


def test_prompts_not_divisible_by_bundle_size_says_which_sizes_work(tmp_path):
    with pytest.raises(ValueError) as error:
        # 8 x 1 process x 5 steps = 40 completions = 4 prompts of 10: not bundles of 5
        tiny_config(tmp_path, run=False, per_device_train_batch_size=8, steps_per_generation=5)
    text = str(error.value)
    assert "4 prompts" in text and "bundle_size=5" in text
    assert "multiple of num_generations * bundle_size = 50 (50, 100, 150" in text
    assert "divides 4 (1, 2, 4)" in text


def test_valid_non_default_layouts(tmp_path):
    config = tiny_config(
        tmp_path,
        run=False,
        num_generations=8,
        bundle_size=4,
        generation_batch_size=64,
        per_device_train_batch_size=8,
        save_strategy="no",
    )  # no checkpoint inside a batch to warn of
    assert config.steps_per_generation == 8
    RiskPOConfig(
        output_dir=str(tmp_path), bundle_size=1, per_device_train_batch_size=10, gradient_accumulation_steps=1
    )


def test_evaluation_batches_may_end_in_a_partial_group(tmp_path):
    config = tiny_config(tmp_path, run=False, eval_strategy="steps", per_device_eval_batch_size=20)
    prompts = config.per_device_eval_batch_size // config.num_generations
    assert prompts % config.bundle_size != 0  # 2 prompts, B=5: one partial bundle group
    estimator = RiskEstimator.from_config(config)
    rewards = torch.arange(config.per_device_eval_batch_size, dtype=torch.float32) % 3
    batch = estimator.step(rewards, generator=torch.Generator().manual_seed(0), train=False)
    assert batch.bundle_scores.numel() == config.num_generations  # one group of G bundles, each of 2 members
    assert not torch.isnan(batch.advantages).any() and estimator.tracker.num_updates == 0
    with pytest.raises(ValueError, match="not a multiple of bundle_size"):  # a training batch must be whole groups
        estimator.step(rewards, generator=torch.Generator().manual_seed(0), train=True)


def test_checkpoints_off_generation_boundaries_warn(tmp_path):
    with pytest.warns(UserWarning, match="do not fall on generation batch boundaries"):
        tiny_config(tmp_path, run=False, save_steps=3, steps_per_generation=10)  # every 15 vs 10 micro-steps
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tiny_config(tmp_path, run=False, save_steps=4, steps_per_generation=10)


def test_the_checkpoint_warning_comes_only_when_a_checkpoint_will_land_mid_batch_and_points_at_the_caller(tmp_path):
    with pytest.warns(UserWarning, match="do not fall on generation batch boundaries") as caught:
        RiskPOConfig(output_dir=str(tmp_path), save_steps=3, steps_per_generation=10, max_steps=12)
    ours = [warning for warning in caught if "generation batch boundaries" in str(warning.message)]
    assert [warning.filename for warning in ours] == [__file__]  # this line, not the dataclass's <string>
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        # No checkpoint is written: nothing to warn about.
        tiny_config(tmp_path, run=False, save_steps=3, steps_per_generation=10, save_strategy="no")
        # The only checkpoint is the final one, at the end of the run.
        tiny_config(tmp_path, run=False, save_steps=30, steps_per_generation=10, max_steps=12)


def test_default_schedule_takes_four_optimizer_steps_per_generation_batch(tmp_path):
    config = tiny_config(tmp_path, run=False)
    assert config.steps_per_generation == 4 * config.gradient_accumulation_steps == 20
    assert config.generation_batch_size // config.num_generations == 20  # 4 groups of B=5 prompts on one process
    config = tiny_config(tmp_path, run=False, gradient_accumulation_steps=2, per_device_train_batch_size=25)
    assert config.steps_per_generation == 8
    # What the user sets wins, either way of saying it.
    assert tiny_config(tmp_path, run=False, steps_per_generation=5).steps_per_generation == 5
    assert tiny_config(tmp_path, run=False, generation_batch_size=100).steps_per_generation == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # default save_steps falls on generation boundaries
        tiny_config(tmp_path, run=False, save_steps=4)
    with pytest.warns(UserWarning, match="do not fall on generation batch boundaries"):
        tiny_config(tmp_path, run=False, save_steps=2)  # 10 micro-steps against a batch every 20


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        ({"advantage_scaling": "authors_code", "risk_omega": 1.5}, "Set quantile_source='group'"),
        ({"advantage_scaling": "authors_code", "quantile_source": "batch"}, "Set quantile_source='group'"),
        ({"credit_assignment": "std"}, "Set advantage_scaling='authors_code' and quantile_source='group'"),
        ({"credit_assignment": "sum_mean", "quantile_source": "group"}, "Set advantage_scaling='authors_code'"),
    ],
)
def test_combinations_neither_source_uses_are_refused_with_the_fix(tmp_path, overrides, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        tiny_config(tmp_path, run=False, **overrides)


def test_a_scaling_s_needed_quantile_source_comes_from_its_registry_entry(tmp_path, monkeypatch):
    """The check reads the scaling's entry, so a scaling registered with a needed source gets it with no other edit."""
    from riskpo_trl.risk import ADVANTAGE_SCALINGS

    entry = ADVANTAGE_SCALINGS.about("authors_code")
    monkeypatch.setitem(entry, "quantile_source", "batch")
    monkeypatch.setitem(entry, "quantile_source_reason", "needs the batch's quantiles here.")
    with pytest.raises(ValueError, match=re.escape("quantile_source='group': that scaling needs the batch's")):
        tiny_config(tmp_path, run=False, advantage_scaling="authors_code", quantile_source="group")
    monkeypatch.delitem(entry, "quantile_source")  # an entry that needs no source: any is taken
    tiny_config(tmp_path, run=False, advantage_scaling="authors_code", quantile_source="tracked")


def test_the_authors_combinations_are_accepted(tmp_path):
    for profile, beta, credit, natural in [
        ("mvar", 0.8, "sum_mean", False),
        ("mvar", 0.9, "std", True),
        ("risk_seeking", 0.8, "std", True),
        ("mvar", 0.8, "score", True),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            tiny_config(
                tmp_path,
                run=False,
                advantage_scaling="authors_code",
                quantile_source="group",
                risk_profile=profile,
                risk_beta=beta,
                credit_assignment=credit,
                natural_baseline=natural,
                risk_omega=1.5,
                bundling="positional",
            )
    with pytest.warns(UserWarning, match="credit_assignment='score'"):
        tiny_config(tmp_path, run=False, credit_assignment="score")


def documented_fields(markdown: str) -> set[str]:
    """The fields named in the first column of the tables of the "## Fields" section."""
    section = markdown.split("## Fields", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`(\w+)`", cell)}


def test_configuration_md_names_every_field_riskpoconfig_declares():
    from pathlib import Path

    markdown = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    declared = set(RiskPOConfig.__dict__["__annotations__"])
    assert declared - documented_fields(markdown) == set()
    assert documented_fields(markdown) - declared == set()  # no row for a field that is not the config's
    assert "regime_guard_patience" not in documented_fields(markdown.replace("| `regime_guard_patience`", "| x"))


@pytest.mark.parametrize("name", ["score", "std", "sum_mean"])
def test_a_credit_rule_outside_its_scaling_is_refused_or_warned_with_its_entrys_reason(tmp_path, name):
    from riskpo_trl.risk import CREDIT_ASSIGNMENTS

    about = CREDIT_ASSIGNMENTS.about(name)
    assert about["scaling"] == "authors_code" and about["other_scaling"] in ("refuse", "warn")
    expected = re.escape(f"credit_assignment={name!r} {about['reason']}")
    if about["other_scaling"] == "refuse":
        with pytest.raises(ValueError, match=expected):
            tiny_config(tmp_path, run=False, credit_assignment=name, quantile_source="group")
    else:
        with pytest.warns(UserWarning, match=expected):
            tiny_config(tmp_path, run=False, credit_assignment=name, quantile_source="group")
    authors = dict(advantage_scaling="authors_code", quantile_source="group", advantage_baseline="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tiny_config(tmp_path, run=False, credit_assignment=name, **authors)  # its own scaling: accepted


def test_the_docstring_documents_each_field_the_config_adds_or_redefines_by_its_help():
    """RiskPOConfig's Parameters are written from the fields' own help (one text for the API docs and the command
    line): every field it adds or redefines is in `DOCUMENTED_FIELDS` once, with its help, and each registry of
    choices is named as `riskpo_trl.risk` names it."""
    import dataclasses

    from trl import GRPOConfig

    import riskpo_trl.risk as risk
    from riskpo_trl.trainer.config import DOCUMENTED_FIELDS

    documented = [name for names in DOCUMENTED_FIELDS.values() for name in names.split()]
    grpo = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    redefined = [
        f
        for f in dataclasses.fields(RiskPOConfig)
        if f.name not in grpo
        or (f.default, f.metadata.get("help")) != (grpo[f.name].default, grpo[f.name].metadata.get("help"))
    ]
    assert sorted(documented) == sorted(f.name for f in redefined)
    for field in redefined:
        assert f"        {field.name} (`" in RiskPOConfig.__doc__, field.name
        opening = " ".join(field.metadata["help"].split("%(choices)s")[0].split()[:6])
        assert opening in " ".join(RiskPOConfig.__doc__.split()), field.name
        registry = field.metadata.get("choices")
        if registry is not None:
            assert getattr(risk, f"{registry.field.upper()}S") is registry, field.name
            assert f"one of [`~riskpo_trl.risk.{registry.field.upper()}S`]" in " ".join(RiskPOConfig.__doc__.split())
