"""A model path that does not exist is reported as such, at once, from Python and from riskpo-train; building a tiny
model in its place is said loudly, never happens under a name that could be a Hub id, and a model built so says what
it is whenever it is loaded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trl.trainer.grpo_trainer
from helpers import contains_digit_reward, make_prompt_dataset

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job, tiny_model
from riskpo_trl.evaluation import evaluator
from riskpo_trl.job.checks import check_model_path, reads_as_local_path
from riskpo_trl.scripts import eval as eval_script
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if anything tries to load a model (from disk or the Hub)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(trl.trainer.grpo_trainer, "create_model_from_path", refuse)


@pytest.mark.parametrize(
    "name",
    [
        "outputs/no-such-model",
        "./no-such-model",
        "../no-such-model",
        "~/no-such-model",
        "/no/such/model",
        "outputs/a/b",
    ],
)
def test_a_missing_local_path_is_named_before_any_load(tmp_path, monkeypatch, no_loading, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    args = RiskPOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        bundle_size=2,
    )
    with pytest.raises(FileNotFoundError, match=rf"model '{name}': no such directory, and not a Hub id"):
        job.build(
            RiskPOTrainer, name, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset()
        )


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
        train.cli(
            [
                "--config",
                str(TINY_RECIPE),
                "--model_name_or_path",
                "outputs/no-such-model",
                "--build_tiny_model",
                "false",
                "--dataset_files",
                str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
            ]
        )
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert (
        "riskpo-train: error: model_name_or_path 'outputs/no-such-model': no such directory, and not a Hub id" in err
    )
    assert "Traceback" not in err


def test_building_a_tiny_model_is_said_loudly(tmp_path, caplog):
    script_args, training_args, model_args = train.parse_args(
        [
            "--config",
            str(TINY_RECIPE),
            "--model_name_or_path",
            str(tmp_path / "tiny"),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
        ]
    )
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)
    assert f"{tmp_path / 'tiny'} did not exist: built a tiny RANDOM Qwen2 model there" in caplog.text
    assert len(tiny_model_lines(caplog)) == 1  # the trainer's own check does not repeat it
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)  # it exists now: loaded, not built
    assert "built a tiny" not in caplog.text


def tiny_model_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if "tiny RANDOM" in record.getMessage()]


@pytest.fixture
def new_process(monkeypatch):
    """As in a new run: the tiny-model warning is given once per process and model."""
    monkeypatch.setattr(tiny_model, "_announced", set())


def test_a_hub_id_is_never_built_into(tmp_path, monkeypatch, capsys, no_loading):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        train.cli(
            [
                "--config",
                str(TINY_RECIPE),
                "--model_name_or_path",
                "Qwen/Qwen2.5-0.5B-Instruct",
                "--dataset_files",
                str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
            ]
        )
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "riskpo-train: error: model_name_or_path 'Qwen/Qwen2.5-0.5B-Instruct' could be a Hub id" in err
    assert "build_tiny_model: false" in err and "./outputs/tiny-qwen2" in err
    assert not (tmp_path / "Qwen").exists()


def test_the_tiny_recipe_builds_at_its_own_path_in_a_fresh_directory(tmp_path, monkeypatch, caplog, new_process):
    """The recipe's path can only be local, so it is built even where no outputs/ exists yet. The recipe is a copy in
    a repository of its own: the checkout's outputs/tiny-qwen2, which the README's first run leaves, is not found."""
    recipe = tmp_path / "repo" / "recipes" / "tiny.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(TINY_RECIPE.read_text())
    monkeypatch.chdir(tmp_path)
    script_args, training_args, model_args = train.parse_args(
        [
            "--config",
            str(recipe),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
        ]
    )
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)
    assert tiny_model.is_tiny_random_model(tmp_path / "outputs" / "tiny-qwen2")


def test_a_built_tiny_model_says_so_whenever_it_is_loaded(tmp_path, monkeypatch, caplog, new_process):
    script_args, training_args, model_args = train.parse_args(
        [
            "--config",
            str(TINY_RECIPE),
            "--model_name_or_path",
            str(tmp_path / "tiny"),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
        ]
    )
    train.build_trainer(script_args, training_args, model_args)
    # riskpo-train, later (even with build_tiny_model false): one line.
    monkeypatch.setattr(tiny_model, "_announced", set())
    caplog.clear()
    script_args.build_tiny_model = False
    with caplog.at_level(logging.WARNING):
        train.build_trainer(script_args, training_args, model_args)
    [line] = tiny_model_lines(caplog)
    assert line.startswith(f"model_name_or_path '{tmp_path / 'tiny'}' is a tiny RANDOM model")
    # The trainer, from Python.
    monkeypatch.setattr(tiny_model, "_announced", set())
    caplog.clear()
    args = RiskPOConfig(
        output_dir=str(tmp_path / "run2"),
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        bundle_size=2,
        use_cpu=True,
        bf16=False,
    )
    with caplog.at_level(logging.WARNING):
        job.build(
            RiskPOTrainer,
            str(tmp_path / "tiny"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=make_prompt_dataset(),
        )
    assert len(tiny_model_lines(caplog)) == 1
    # riskpo-eval, before it evaluates.
    monkeypatch.setattr(tiny_model, "_announced", set())
    caplog.clear()

    def stop(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluator, "evaluate", stop)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        eval_script.main(
            ["--model", str(tmp_path / "tiny"), "--benchmarks", "math500", "--output_dir", str(tmp_path / "eval")]
        )
    assert len(tiny_model_lines(caplog)) == 1


def test_a_model_not_built_here_gets_no_tiny_model_warning(tmp_path, caplog, new_process):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
        tiny_model.build_tiny_model()[0].config.__class__(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    model.save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.WARNING):
        assert not tiny_model.warn_if_tiny_random_model(str(tmp_path / "plain"))
        assert not tiny_model.warn_if_tiny_random_model(model)
    assert not tiny_model_lines(caplog)
