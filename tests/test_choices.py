"""Each named choice of the advantage step is resolved once, at construction, into the registered behaviour: the walk
of ``advantage_baseline`` from the config to the advantage, and the one module that maps choice names to behaviour."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

from riskpo_trl import RiskEstimator, RiskPOConfig
from riskpo_trl.registry import Registry
from riskpo_trl.risk import (
    ADVANTAGE_SCALINGS,
    DEFAULT_CHOICES,
    RiskChoices,
    leave_one_out_baseline,
    no_baseline,
)

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "riskpo_trl"
CHOICE_REGISTRIES = (
    "RISK_PROFILES",
    "ADVANTAGE_SCALINGS",
    "QUANTILE_SOURCES",
    "BUNDLINGS",
    "CREDIT_ASSIGNMENTS",
    "ADVANTAGE_BASELINES",
)
# Where each registry is filled: registering an entry may look its own registry up there.
DEFINED_IN = {"RISK_PROFILES": "risk/advantages.py", "ADVANTAGE_SCALINGS": "risk/advantages.py"}


def lookups(tree: ast.AST) -> set[str]:
    """The choice registries a module looks a name up in: ``R.get(name)``, ``R.check(name)`` or ``R[name]``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "check"):
            target = node.func.value
        elif isinstance(node, ast.Subscript):
            target = node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in CHOICE_REGISTRIES:
            found.add(target.id)
    return found


def test_only_the_choices_module_maps_a_choice_name_to_behaviour():
    where = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        relative = path.relative_to(PACKAGE_DIR).as_posix()
        for registry in lookups(ast.parse(path.read_text())):
            where.setdefault(registry, set()).add(relative)
    for registry in CHOICE_REGISTRIES:
        allowed = {"risk/choices.py", DEFINED_IN.get(registry, "risk/choices.py")}
        assert where.get(registry, set()) <= allowed, (registry, where.get(registry))
    assert where["ADVANTAGE_BASELINES"] == {"risk/choices.py"}


def test_the_lookup_check_sees_a_lookup_elsewhere():
    """The check above can fail: a per-batch lookup by name, as the advantage step once did, is found."""
    assert lookups(ast.parse("baseline = ADVANTAGE_BASELINES.get(name)")) == {"ADVANTAGE_BASELINES"}
    assert lookups(ast.parse("fn = BUNDLINGS[self.bundling]")) == {"BUNDLINGS"}


def test_advantage_baseline_walks_from_the_config_to_the_advantage_with_no_lookup_per_batch(tmp_path, monkeypatch):
    """Config (resolves unset, checks) -> estimator (resolves the name once into the function) -> each batch calls
    the function: after construction no registry is asked for a name."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    settings = dict(
        num_generations=4,
        bundle_size=3,
        per_device_train_batch_size=12,
        gradient_accumulation_steps=1,
        use_cpu=True,
    )
    estimators = {
        name: RiskEstimator.from_config(tiny_config(tmp_path, run=False, **settings, advantage_baseline=name))
        for name in ("none", "loo")
    }
    assert estimators["none"].rule.baseline is no_baseline
    assert estimators["loo"].rule.baseline is leave_one_out_baseline
    assert (
        RiskEstimator.from_config(tiny_config(tmp_path, run=False, **settings)).rule.baseline is leave_one_out_baseline
    )  # unset

    asked = []
    for method in ("get", "check", "__getitem__"):
        original = getattr(Registry, method)
        monkeypatch.setattr(
            Registry, method, lambda self, name, _original=original: asked.append(name) or _original(self, name)
        )
    batches = {
        name: [estimator.step(rewards, generator=torch.Generator().manual_seed(step), train=True) for step in range(3)]
        for name, estimator in estimators.items()
    }
    assert asked == []
    for paper, loo in zip(batches["none"], batches["loo"]):
        assert torch.equal(paper.bundle_ids, loo.bundle_ids)
        expected = leave_one_out_baseline(paper.advantages.double(), ~paper.unscorable, 4).float()
        assert torch.allclose(loo.advantages, expected)


def test_the_choices_defaults_are_written_once():
    """The config's fields, the estimator and the one-call function take their defaults from RiskChoices."""
    import inspect

    from riskpo_trl.risk import riskpo_advantages

    config_defaults = {name: field.default for name, field in RiskPOConfig.__dataclass_fields__.items()}
    for name, value in vars(DEFAULT_CHOICES).items():
        assert config_defaults[name] == value, name
        for function in (RiskEstimator.__init__, riskpo_advantages):
            parameter = inspect.signature(function).parameters.get(name)
            assert parameter is None or parameter.default == value, (function, name)
    assert RiskChoices.from_config(object()) == DEFAULT_CHOICES  # a config without a choice takes its default


def test_advantage_scalings_hold_the_formulas():
    assert set(ADVANTAGE_SCALINGS["none"].formulas) >= {"mvar", "rvar", "risk_seeking"}
    assert set(ADVANTAGE_SCALINGS["authors_code"].formulas) == {"mvar", "risk_seeking"}
    with pytest.raises(ValueError, match="not 'rvar'"):
        ADVANTAGE_SCALINGS["authors_code"].of("rvar")
