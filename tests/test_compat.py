"""The supported TRL and transformers range (pyproject's pins are the tested range; anything outside it is refused with
one message when the trainer is imported), the private API `riskpo_trl.compat` lists, and its shims."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
from helpers import tiny_config, tiny_trainer
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from riskpo_trl import compat
from riskpo_trl.compat import generation, private_api
from riskpo_trl.trainer import RiskPOConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_version_check():
    compat.check_versions.cache_clear()
    yield
    compat.check_versions.cache_clear()


def seen_versions(monkeypatch, **versions):
    """Make the version check see these releases (None: not installed), the other checked packages at their newest
    tested release, and no override: what a test of the check sees does not depend on the releases installed (CI's
    check of the newest releases installs untested ones, with the override set)."""
    real = compat.installed_version
    seen = {package: newest for package, (_, newest) in compat.TESTED.items()} | versions
    monkeypatch.setattr(compat, "installed_version", lambda package: seen.get(package, real(package)))
    monkeypatch.delenv(compat.ALLOW_UNTESTED_ENV, raising=False)


# --- the range --------------------------------------------------------------------------------------------------------


def test_pyproject_pins_are_the_tested_range():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {req.name: req.specifier for req in map(Requirement, dependencies) if req.name in compat.PINS}
    assert declared == {name: SpecifierSet(pins) for name, pins in compat.PINS.items()}
    for package, (lowest, newest) in compat.TESTED.items():
        bounds = {str(spec) for spec in declared[package]}
        major, minor = Version(newest).release[:2]
        assert f">={lowest}" in bounds and f"<{major}.{minor + 1}" in bounds, package
        assert lowest in declared[package] and newest in declared[package]


@pytest.mark.parametrize(
    "release, supported",
    [
        ("1.12.0", False),
        ("1.13.0", True),
        ("1.14.2", True),
        ("1.15.0", False),
        ("1.16.0", True),
        ("1.17.0", False),
    ],
)
def test_trl_pins_keep_out_the_broken_release(release, supported):
    assert (release in SpecifierSet(compat.PINS["trl"])) is supported


@pytest.mark.parametrize(
    "release, supported",
    [
        ("4.56.1", False),
        ("4.56.2", True),
        ("5.0.0", True),
        ("5.1.0", False),
        ("5.2.0", False),
        ("5.4.0", False),
        ("5.5.3", False),
        ("5.5.4", True),
        ("5.23.0", True),
        ("5.24.0", True),
        ("5.25.0", False),
    ],
)
def test_transformers_pins_keep_out_the_double_division_releases(release, supported):
    assert (release in SpecifierSet(compat.PINS["transformers"])) is supported


def test_the_installed_releases_are_supported():
    if os.environ.get(compat.ALLOW_UNTESTED_ENV) == "1":
        pytest.skip("untested releases admitted on purpose: this run tells whether the range may widen to them")
    assert compat.version_problems() == []


# --- the check at import -----------------------------------------------------------------------------------------------


def test_an_unsupported_trl_gives_one_error_naming_the_range(monkeypatch):
    seen_versions(monkeypatch, trl="1.17.0")
    with pytest.raises(compat.UnsupportedVersionError) as error:
        compat.check_versions()
    message = str(error.value)
    assert (
        "trl 1.17.0 installed; supported: trl>=1.13.0,<1.17,!=1.15.0 (tested 1.13.0 to 1.16.0; 1.15.0 excluded"
        in message
    )
    assert "\n  transformers" not in message  # only the package that is out of range
    assert "pip install 'trl>=1.13.0,<1.17,!=1.15.0' 'transformers>=4.56.2,<5.25" in message


def test_every_package_out_of_range_is_named_in_the_same_error(monkeypatch):
    seen_versions(monkeypatch, trl=None, transformers="5.4.0")
    with pytest.raises(
        compat.UnsupportedVersionError,
        match=r"(?s)trl not installed.*transformers 5\.4\.0 installed.*"
        r"divide the loss by gradient_accumulation_steps twice",
    ):
        compat.check_versions()


def test_untested_releases_run_with_a_warning_when_asked(monkeypatch):
    seen_versions(monkeypatch, trl="1.17.0")
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, "1")
    with pytest.warns(UserWarning, match="trl 1.17.0 installed"):
        compat.check_versions()


@pytest.mark.parametrize("module", ["riskpo_trl.trainer.riskpo_trainer", "riskpo_trl.trainer.config"])
def test_importing_the_trainer_with_an_unsupported_trl_stops_with_the_range(module):
    # A fresh interpreter whose package metadata reports TRL 1.12.0.
    code = (
        "import importlib.metadata as m; real = m.version; "
        "m.version = lambda name: '1.12.0' if name == 'trl' else real(name); "
        f"import {module}"
    )
    env = {key: value for key, value in os.environ.items() if key != compat.ALLOW_UNTESTED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert (
        "riskpo_trl.compat.UnsupportedVersionError: riskpo-trl supports the TRL and transformers releases"
        in result.stderr
    )
    assert result.stderr.count("trl 1.12.0 installed; supported: trl>=1.13.0") == 1


# --- the private API ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("owner", list(private_api.PRIVATE_METHODS))
def test_overridden_private_methods_take_the_parameters_relied_on(owner):
    module, _, name = owner.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    for method, parameters in private_api.PRIVATE_METHODS[owner].items():
        assert tuple(inspect.signature(getattr(cls, method)).parameters)[1:] == parameters, f"{owner}.{method}"


def test_a_built_trainer_has_the_private_attributes_relied_on(tiny_model_dir, tmp_path):
    trainer = tiny_trainer(tiny_model_dir, tmp_path)
    missing = [name for name in private_api.PRIVATE_ATTRIBUTES["trl.GRPOTrainer"] if not hasattr(trainer, name)]
    assert missing == []
    assert set(trainer._logs) >= {"advantages", "extra"} and set(trainer._metrics) >= {"train", "eval"}


@pytest.mark.parametrize("owner", list(private_api.PRIVATE_CLASS_ATTRIBUTES))
def test_the_class_attributes_relied_on_exist(owner):
    cls = listed_class(owner)
    assert [name for name in private_api.PRIVATE_CLASS_ATTRIBUTES[owner] if not hasattr(cls, name)] == []


@pytest.mark.parametrize("owner", [owner for owner in private_api.PRIVATE_ATTRIBUTES if owner != "trl.GRPOTrainer"])
def test_the_attributes_of_other_built_objects_are_set_by_their_class(owner):
    """What cannot be built here (a vLLM client without a server, vLLM's worker) is read: the class sets it."""
    try:
        cls = listed_class(owner)
    except ImportError:
        pytest.skip(f"{owner} is not installed here")
    source = "".join(
        inspect.getsource(klass)
        for klass in cls.__mro__
        if klass.__module__.split(".")[0] in ("trl", "transformers", "vllm")
    )
    assert [name for name in private_api.PRIVATE_ATTRIBUTES[owner] if f"self.{name} =" not in source] == []


def listed_class(owner: str) -> type:
    module, _, name = owner.rpartition(".")
    return getattr(importlib.import_module(module), name)


# --- TRL's behaviour relied on, checked as the trainer runs ----------------------------------------------------------


def test_each_broken_assumption_raises_naming_the_installed_trl():
    installed = f"TRL {compat.installed_version('trl')} does not behave as riskpo-trl relies on"
    with pytest.raises(compat.TRLChangedError, match=rf"{installed}.*gathered over all 2 process\(es\), 8 rows.*4"):
        compat.check_gathered_rewards(4, 4, 2)
    compat.check_gathered_rewards(8, 4, 2)
    buffered = [{"step": 0}, {"step": 1}]
    compat.check_buffered_micro_batch(buffered[1], buffered, 1)
    with pytest.raises(compat.TRLChangedError, match=rf"{installed}.*_step % steps_per_generation.*here 1"):
        compat.check_buffered_micro_batch(dict(buffered[1]), buffered, 1)
    # a table bounded to 6 entries that kept the last 6 of an 8-completion batch; this process holds entries 4 to 7
    from collections import deque

    logged = deque([0.5, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], maxlen=6)
    compat.check_logged_advantages(logged, 8, [0.4, 0.5, 0.6, 0.7], 4)
    compat.check_logged_advantages(logged, 8, [0.0, 0.1], 0)  # entries no longer kept are not compared
    logged.append(9.0)  # one more entry after the batch's
    with pytest.raises(compat.TRLChangedError, match=rf"{installed}.*table's last entries are not this batch's"):
        compat.check_logged_advantages(logged, 8, [0.4, 0.5, 0.6, 0.7], 4)


def returning_doubled_rewards(real):
    def doubled(self, *args):
        rewards = real(self, *args)
        return torch.cat([rewards, rewards])  # as if gathered from a second process

    return doubled


def returning_a_copy(real):
    def copied(self, *args):
        return dict(real(self, *args))

    return copied


def logging_one_more_advantage(real):
    def logged_more(self, *args):
        outputs = real(self, *args)
        self._logs["advantages"].append(9.0)
        return outputs

    return logged_more


BROKEN_ASSUMPTIONS = {
    "_calculate_rewards": (returning_doubled_rewards, "gathered over all 1 process"),
    "_prepare_inputs": (returning_a_copy, r"_buffered_inputs\[_step % steps_per_generation\]"),
    "_generate_and_score_completions": (logging_one_more_advantage, "table's last entries are not this batch's"),
}


@pytest.mark.parametrize("method", list(BROKEN_ASSUMPTIONS))
def test_a_trl_that_breaks_an_assumption_stops_the_run_naming_its_release(
    tiny_model_dir, tmp_path, monkeypatch, method
):
    """TRL's method changed so that the assumption no longer holds: the first training step stops with the error."""
    from trl import GRPOTrainer

    breaking, message = BROKEN_ASSUMPTIONS[method]
    monkeypatch.setattr(GRPOTrainer, method, breaking(getattr(GRPOTrainer, method)))
    args = tiny_config(tmp_path, loss_type="bnpo", loss_token_mean_sequences=8)
    trainer = tiny_trainer(tiny_model_dir, args=args)
    with pytest.raises(compat.TRLChangedError, match=f"TRL {compat.installed_version('trl')} .*{message}"):
        trainer.train()


def test_the_advantage_hook_is_found_when_trl_defines_it(monkeypatch):
    from trl import GRPOTrainer

    assert private_api.trl_advantage_hook() is None  # no supported release has one
    monkeypatch.setattr(GRPOTrainer, "_transform_advantages", lambda self, advantages: advantages, raising=False)
    assert private_api.trl_advantage_hook() == "_transform_advantages"
    monkeypatch.setattr(GRPOTrainer, "_transform_advantages", lambda self, rewards, mode: rewards)
    assert private_api.trl_advantage_hook() is None  # another signature is not the hook the trainer would use


# --- the shims -------------------------------------------------------------------------------------------------------


class CheckpointedModel:
    is_gradient_checkpointing = True

    def __init__(self):
        self.enabled_with = []

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.enabled_with.append(gradient_checkpointing_kwargs)


def test_generation_turns_checkpointing_back_on_with_the_runs_kwargs_under_trl_before_1_16(monkeypatch):
    import trl.models.utils

    @contextlib.contextmanager
    def unwrap_without_the_keyword(model, accelerator, gather_deepspeed3_params=True, generation_kwargs=None):
        yield model
        model.gradient_checkpointing_enable()  # as TRL 1.13 and 1.14 do: the defaults

    monkeypatch.setattr(trl.models.utils, "unwrap_model_for_generation", unwrap_without_the_keyword)
    model = CheckpointedModel()
    with generation.unwrap_for_generation(model, None, {"use_reentrant": False}) as unwrapped:
        assert unwrapped is model
    assert model.enabled_with == [None, {"use_reentrant": False}]


def test_the_image_token_is_suppressed_once_and_a_configured_suppression_wins():
    from types import SimpleNamespace

    from riskpo_trl.multimodal import build_tiny_vlm

    model, processor = build_tiny_vlm()
    trainer = SimpleNamespace(processing_class=processor, model=model, generation_kwargs={"max_new_tokens": 4})
    generation.suppress_image_token(trainer)
    assert trainer.generation_kwargs["suppress_tokens"] == [model.config.image_token_id]
    assert trainer.generation_config.suppress_tokens == [model.config.image_token_id]
    chosen = SimpleNamespace(processing_class=processor, model=model, generation_kwargs={"suppress_tokens": [5]})
    generation.suppress_image_token(chosen)
    assert chosen.generation_kwargs == {"suppress_tokens": [5]} and not hasattr(chosen, "generation_config")


def test_reward_functions_count_as_async_exactly_when_the_installed_trl_awaits_them():
    async def coroutine_function(**kwargs):
        return []

    class AsyncCallable:
        async def __call__(self, **kwargs):
            return []

    assert generation.trl_awaits(coroutine_function) and not generation.trl_awaits(lambda **kwargs: [])
    awaits_objects = Version(compat.installed_version("trl")) >= Version("1.14.0")
    assert generation.trl_awaits(AsyncCallable()) is awaits_objects


def test_the_liger_rule_matches_the_installed_trls_loss():
    from trl import GRPOTrainer

    liger_branch = "use_liger_kernel" in inspect.getsource(GRPOTrainer.compute_loss)
    assert compat.liger_skips_compute_loss() is liger_branch


@pytest.mark.parametrize("skips", [True, False])
def test_liger_with_loss_token_mean_sequences_is_refused_where_the_factors_would_be_dropped(
    monkeypatch, tmp_path, skips
):
    monkeypatch.setattr(compat, "liger_skips_compute_loss", lambda: skips)
    fields = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "use_liger_kernel": True,
        "loss_type": "bnpo",
        "loss_token_mean_sequences": 16,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 4,
        "num_generations": 8,
        "bundle_size": 1,
    }
    if skips:
        with pytest.raises(
            ValueError, match="use_liger_kernel=True with loss_token_mean_sequences=16.*silently dropped"
        ):
            RiskPOConfig(**fields)
    else:
        assert RiskPOConfig(**fields).loss_token_mean_sequences == 16


def test_the_loss_types_checked_at_config_time_are_the_installed_trls():
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer)
    named = set(re.findall(r'loss_type == "(\w+)"', source))
    for listed in re.findall(r"loss_type in \[([^\]]*)\]", source):
        named |= set(re.findall(r'"(\w+)"', listed))
    assert named == set(compat.TRL_LOSS_TYPES)
