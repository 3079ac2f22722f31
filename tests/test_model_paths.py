"""A model path that does not exist is reported as such, at once, from Python and from riskpo-train; building a tiny
model in its place is said loudly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trl.trainer.grpo_trainer

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.trainer.checks import check_model_path, reads_as_local_path
from riskpo_trl.scripts import train

from helpers import contains_digit_reward, make_prompt_dataset

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if anything tries to load a model (from disk or the Hub)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(trl.trainer.grpo_trainer, "create_model_from_path", refuse)


@pytest.mark.parametrize("name", ["outputs/no-such-model", "./no-such-model", "../no-such-model", "~/no-such-model",
                                  "/no/such/model", "outputs/a/b"])
def test_a_missing_local_path_is_named_before_any_load(tmp_path, monkeypatch, no_loading, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    args = RiskPOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4,
                        gradient_accumulation_steps=1, bundle_size=2)
    with pytest.raises(FileNotFoundError, match=rf"model '{name}': no such directory, and not a Hub id"):
        RiskPOTrainer(name, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset())


def test_hub_ids_and_existing_paths_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("Qwen/Qwen2.5-Math-1.5B-Instruct", "gpt2", str(tmp_path)):
        check_model_path(name)
    assert not reads_as_local_path("outputs/model")  # no outputs/ here: it may be a Hub repository
    (tmp_path / "outputs").mkdir()
    assert reads_as_local_path("outputs/model")


def test_riskpo_train_reports_a_missing_model_path_in_one_line(tmp_path, monkeypatch, capsys, no_loading):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    with pytest.raises(SystemExit) as exit:
        train.cli(["--config", str(TINY_RECIPE), "--model_name_or_path", "outputs/no-such-model",
                   "--build_tiny_model", "false",
                   "--dataset_files", str(ROOT / "examples/data/tiny_arithmetic.jsonl")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert ("riskpo-train: error: model_name_or_path 'outputs/no-such-model': no such directory, and not a Hub id"
            in err)
    assert "Traceback" not in err


def test_building_a_tiny_model_is_said_loudly(tmp_path, caplog):
    script_args, training_args, model_args = train.parse_args([
        "--config", str(TINY_RECIPE), "--model_name_or_path", str(tmp_path / "tiny"),
        "--output_dir", str(tmp_path / "run"),
        "--dataset_files", str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
    ])
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)
    assert f"{tmp_path / 'tiny'} does not exist: building a tiny RANDOM Qwen2 model there" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)  # it exists now: loaded, not built
    assert "building a tiny" not in caplog.text
