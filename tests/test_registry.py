"""Typed registries: each registry says what an entry must say of itself, and an entry that does not is refused when
it is registered; entries registered for a while leave nothing behind; a risk profile has hyperparameters of its own."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from riskpo_trl import RiskEstimator
from riskpo_trl.code.executor import EXECUTORS
from riskpo_trl.data.datasets import BENCHMARKS, TRAIN_DATASETS
from riskpo_trl.data.prompts import PROMPT_BUILDERS
from riskpo_trl.registry import RegistrationError, Registry, Says, temporary_entries
from riskpo_trl.rewards.registry import REWARD_BUILDERS, REWARD_FUNCS
from riskpo_trl.risk import (
    ADVANTAGE_BASELINES,
    ADVANTAGE_SCALINGS,
    BUNDLINGS,
    CREDIT_ASSIGNMENTS,
    QUANTILE_SOURCES,
    RISK_PROFILES,
    AdvantageScaling,
    ProfileParameter,
    register_risk_profile,
)
from riskpo_trl.risk.contracts import EXPECTED_GRADIENT_TOLERANCE, expected_gradient_gap
from riskpo_trl.trainer.registry import TRAINERS


def no_baseline_at_all(advantages, scorable, num_generations):
    return advantages


def test_a_baseline_without_its_card_words_is_refused_when_registered():
    with pytest.raises(
        RegistrationError, match=r"advantage_baseline 'plain' is registered without 'card' \(how a model"
    ):
        ADVANTAGE_BASELINES.add("plain", no_baseline_at_all, help="nothing", centred=False, uses_own_reward=False)
    assert "plain" not in ADVANTAGE_BASELINES


@pytest.mark.parametrize(
    "about, message",
    [
        ({"card": "x", "centred": False}, "without 'uses_own_reward'"),
        ({"card": "x", "centred": "no", "uses_own_reward": False}, "centred='no'; centred is whether .*, a bool"),
        (
            {"crad": "x", "centred": False, "uses_own_reward": False},
            r"with \['crad'\] \(did you mean card for crad\?\)",
        ),
    ],
)
def test_a_baseline_entry_that_does_not_fit_the_spec_is_refused(about, message):
    with pytest.raises(RegistrationError, match=message):
        ADVANTAGE_BASELINES.add("plain", no_baseline_at_all, help="nothing", **about)
    assert "plain" not in ADVANTAGE_BASELINES


def test_a_scaling_that_names_a_quantile_source_without_its_reason_is_refused_when_registered():
    """Before: a KeyError when a config combined it with another quantile source."""
    with pytest.raises(
        RegistrationError, match="advantage_scaling 'mine' is registered without 'quantile_source_reason'"
    ):
        ADVANTAGE_SCALINGS.add("mine", AdvantageScaling("mine"), help="mine", quantile_source="group")
    assert "mine" not in ADVANTAGE_SCALINGS


def test_a_credit_rule_says_refuse_or_warn():
    with pytest.raises(
        RegistrationError, match=r"other_scaling='ignore'; other_scaling is one of \['refuse', 'warn'\]"
    ):
        CREDIT_ASSIGNMENTS.add(
            "mine", lambda *args: args[0], help="mine", scaling="authors_code", other_scaling="ignore", reason="."
        )


@pytest.mark.parametrize("registry", [BUNDLINGS, QUANTILE_SOURCES, RISK_PROFILES, TRAINERS, EXECUTORS])
def test_a_choice_listed_with_its_help_is_refused_without_one(registry):
    with (
        pytest.raises(RegistrationError, match=f"{registry.field} 'mine' is registered without its help"),
        temporary_entries(),
    ):
        registry.add("mine", object())


def test_every_registry_declares_what_its_entries_say_and_each_entry_says_it():
    """Each registered entry of every registry fits its registry's spec (checked again, as at registration)."""
    registries = [
        ADVANTAGE_BASELINES,
        ADVANTAGE_SCALINGS,
        BUNDLINGS,
        CREDIT_ASSIGNMENTS,
        QUANTILE_SOURCES,
        RISK_PROFILES,
        TRAINERS,
        EXECUTORS,
        REWARD_FUNCS,
        REWARD_BUILDERS,
        TRAIN_DATASETS,
        BENCHMARKS,
        PROMPT_BUILDERS,
    ]
    for registry in registries:
        for name in registry:
            registry.check_about(name, registry.about(name), registry.help_of(name))
    assert set(ADVANTAGE_BASELINES.spec) == {"card", "centred", "uses_own_reward"}


def test_entries_registered_in_a_temporary_block_are_gone_after_it_even_on_an_error():
    registry: Registry[int] = Registry("example", spec={"size": Says(int, "a size")})
    registry.add("kept", 0, size=0)
    with pytest.raises(RuntimeError, match="inside"), temporary_entries():
        registry.add("trial", 1, size=1)
        with registry.temporarily("nested", 2, size=2) as entry:
            assert entry == 2 and list(registry) == ["kept", "trial", "nested"]
        assert list(registry) == ["kept", "trial"]
        raise RuntimeError("inside")
    assert list(registry) == ["kept"] and registry.about("kept") == {"size": 0}
    registry.add("trial", 3, size=3)  # the name is free again


def test_what_a_module_registers_when_first_imported_inside_the_block_stays(tmp_path, monkeypatch):
    """A registry's module-level entries (a track's reward, a plug-in's profile) live as long as their module, which
    stays imported: a block that happens to import it first must not take them away."""
    registry: Registry[int] = Registry("example")
    monkeypatch.setattr(sys.modules[__name__], "SHARED_REGISTRY", registry, raising=False)
    (tmp_path / "plugin_registering_on_import.py").write_text(
        f"import {__name__} as tests\ntests.SHARED_REGISTRY.add('from_the_module', 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with temporary_entries():
        importlib.import_module("plugin_registering_on_import")
        registry.add("from_the_block", 2)
    assert list(registry) == ["from_the_module"]
    sys.modules.pop("plugin_registering_on_import")


# --- a risk profile's own hyperparameters --------------------------------------------------------------------------


def exponential_objective(scores, q_alpha, q_beta, omega, eta):
    """The exponential utility E[-exp(-eta R) / eta]: risk-averse, more so for a larger eta."""
    return (-torch.exp(-eta * scores[torch.isfinite(scores)]) / eta).mean()


def exponential_advantage(scores, q_alpha, q_beta, omega, eta):
    return -torch.exp(-eta * scores) / eta


EXPONENTIAL = {"eta": ProfileParameter(1.0, "the risk aversion", lambda value: value > 0, "> 0")}


def register_exponential():
    register_risk_profile(
        "exponential", objective=exponential_objective, help="exponential utility", parameters=EXPONENTIAL
    )(exponential_advantage)


def test_a_profile_with_its_own_hyperparameter_takes_it_from_the_config(tmp_path):
    from helpers import tiny_config

    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    with temporary_entries():
        register_exponential()
        assert expected_gradient_gap(RISK_PROFILES["exponential"]) < EXPECTED_GRADIENT_TOLERANCE
        for eta in (1.0, 3.0):
            parameters = {"eta": eta} if eta != 1.0 else None  # unset: the default
            config = tiny_config(
                tmp_path,
                risk_profile="exponential",
                risk_profile_parameters=parameters,
                advantage_baseline="none",
                bundling="positional",
            )
            estimator = RiskEstimator.from_config(config)
            batch = estimator.step(rewards, generator=torch.Generator().manual_seed(0), train=True)
            expected = exponential_advantage(batch.bundle_scores, 0, 0, 0, eta).float()
            assert torch.allclose(batch.advantages, expected[batch.bundle_ids])
            utility = exponential_objective(batch.bundle_scores, 0, 0, 0, eta).item()
            assert estimator.metrics(batch)["risk/exponential"] == pytest.approx(utility)
        with pytest.raises(ValueError, match=r"names \['etta'\] \(did you mean eta for etta\?\), not parameters"):
            tiny_config(tmp_path, risk_profile="exponential", risk_profile_parameters={"etta": 2.0})
        with pytest.raises(
            ValueError, match=r"eta=-1.0 for risk_profile='exponential': eta is the risk aversion.*> 0"
        ):
            tiny_config(tmp_path, risk_profile="exponential", risk_profile_parameters='{"eta": -1.0}')
    assert "exponential" not in RISK_PROFILES and "exponential" not in ADVANTAGE_SCALINGS["none"].formulas


def test_a_builtin_profile_has_no_parameters_to_set(tmp_path):
    from helpers import tiny_config

    with pytest.raises(ValueError, match=r"not parameters of risk_profile='mvar'; it takes none"):
        tiny_config(tmp_path, risk_profile_parameters={"eta": 2.0})
    with pytest.raises(ValueError, match="risk_profile_parameters='eta=2' is not JSON"):
        tiny_config(tmp_path, risk_profile_parameters="eta=2")


def test_the_command_line_takes_a_profiles_parameters_as_json(tmp_path):
    from riskpo_trl.scripts import train

    with temporary_entries():
        register_exponential()
        argv = ["--risk_profile", "exponential", "--risk_profile_parameters", '{"eta": 2.5}']
        _, args, _ = train.parse_args([*argv, "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert args.risk_profile_parameters == {"eta": 2.5}


@pytest.mark.parametrize(
    "parameters, formula, message",
    [
        (
            {"eta": ProfileParameter(1.0, "x")},
            lambda scores, q_alpha, q_beta, omega: scores,
            "formula <lambda> does not take",
        ),
        ({"omega": ProfileParameter(1.0, "x")}, exponential_advantage, "which every formula already gets"),
        (
            {"eta": ProfileParameter(-1.0, "x", lambda v: v > 0)},
            exponential_advantage,
            "default -1.0 it does not allow",
        ),
        ({"eta": 1.0}, exponential_advantage, "give a ProfileParameter"),
    ],
)
def test_a_profile_parameter_its_functions_cannot_take_is_refused_when_registered(parameters, formula, message):
    with temporary_entries():
        decorate = register_risk_profile("broken", objective=exponential_objective, help="x", parameters=parameters)
        with pytest.raises(RegistrationError, match=message):
            decorate(formula)
        assert "broken" not in RISK_PROFILES
