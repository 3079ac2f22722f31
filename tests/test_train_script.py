"""End-to-end runs of riskpo_trl.scripts.train on the tiny CPU recipe: resume after a kill, reload, model card."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from riskpo_trl.evaluation.plots import find_trainer_state, load_run
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_GRPO_RECIPE = ROOT / "recipes/tiny/grpo/config_tiny_arithmetic.yaml"


def run(tmp_path: Path, *overrides: str, recipe: Path = TINY_RECIPE):
    args = train.parse_args(
        [
            "--config",
            str(recipe),
            "--model_name_or_path",
            str(tmp_path / "tiny-model"),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
            "--max_completion_length",
            "8",
            *overrides,
        ]
    )
    return train.main(*args)


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """Two steps with a checkpoint at step 2 (the 'killed' run), then the same command with max_steps 4."""
    tmp_path = tmp_path_factory.mktemp("resume")
    first = run(tmp_path, "--max_steps", "2", "--save_steps", "2")
    first_history = list(first.state.log_history)
    second = run(tmp_path, "--max_steps", "4", "--save_steps", "2")
    return tmp_path, first_history, second


def test_rerun_resumes_from_last_checkpoint(resumed_run):
    """The script's part of resuming: the same command finds the last checkpoint in output_dir by itself. (What a
    checkpoint restores, RiskPO's trackers included, is tested on the trainer and under ZeRO-3.)"""
    tmp_path, first_history, second = resumed_run
    assert second.state.global_step == 4
    # The restored state carries the first run's logs for steps 1-2.
    steps = [entry["step"] for entry in second.state.log_history if "loss" in entry]
    assert steps == [1, 2, 3, 4]
    assert [e for e in second.state.log_history if e["step"] <= 2 and "loss" in e] == [
        e for e in first_history if "loss" in e
    ]
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_output_reloads_with_its_card(resumed_run):
    """The script saves a reloadable model, its tokenizer and a RiskPO card (the card's contents are tested on the
    trainer); trained on local files, the card does not claim the Hub dataset."""
    tmp_path, _, _ = resumed_run
    output_dir = tmp_path / "run"
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert model.config.model_type == "qwen2" and tokenizer.chat_template
    card = (output_dir / "README.md").read_text()
    assert "RiskPO" in card
    # The run read a local file in GSM8K's schema: the card names the file, not the Hub dataset.
    assert "`tiny_arithmetic.jsonl`" in card and "openai/gsm8k" not in card


@pytest.mark.slow
def test_grpo_baseline_trains_through_the_same_script(tmp_path):
    trainer = run(
        tmp_path, "--loss_type", "dr_grpo", "--max_steps", "1", "--save_strategy", "no", recipe=TINY_GRPO_RECIPE
    )
    assert type(trainer).__name__ == "GRPOTrainer"
    assert trainer.args.loss_type == "dr_grpo" and not hasattr(trainer.args, "bundle_size")
    assert trainer.state.global_step == 1
    # No checkpoint was saved, yet the log history the plots read is in output_dir.
    state_file = tmp_path / "run" / "trainer_state.json"
    assert state_file.is_file() and not list((tmp_path / "run").glob("checkpoint-*"))
    assert find_trainer_state(tmp_path / "run") == state_file
    run_logs = load_run(str(tmp_path / "run"))
    assert run_logs.name == "run" and any("loss" in entry for entry in run_logs.log_history)


class _DatasetsLoaded(Exception):
    """Raised by the stand-in benchmark loader: the test needs nothing after the datasets."""


def test_prompt_template_reaches_the_training_and_the_evaluation_set(monkeypatch, tmp_path):
    from riskpo_trl import tracks as data  # the script reads the registries with every track in

    asked, load_train_dataset = {}, data.load_train_dataset

    def training_set(*args, prompt_template, **kwargs):
        asked["train"] = prompt_template
        return load_train_dataset(*args, prompt_template=prompt_template, **kwargs)

    def benchmark(name, *, limit, prompt_template):
        asked["eval"] = prompt_template
        raise _DatasetsLoaded

    monkeypatch.setattr(data, "load_train_dataset", training_set)
    monkeypatch.setattr(data, "load_benchmark", benchmark)
    args = train.parse_args(
        [
            "--config",
            str(TINY_RECIPE),
            "--model_name_or_path",
            str(tmp_path / "model"),
            "--build_tiny_model",
            "true",
            "--output_dir",
            str(tmp_path / "run"),
            "--prompt_template",
            "authors",
            "--eval_benchmark",
            "gsm8k",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "1",
            "--per_device_eval_batch_size",
            "20",
        ]
    )
    with pytest.raises(_DatasetsLoaded):
        train.build_trainer(*args)
    assert asked == {"train": "authors", "eval": "authors"}


@pytest.mark.parametrize("trainer_name", ["grpo", "gmpo"])
def test_baselines_built_by_the_script_never_sample_a_vlms_image_token(trainer_name, tmp_path, monkeypatch):
    """Generating without vLLM, a sampled image token mismatches the image features. RiskPOTrainer suppresses it,
    and TRL 1.16 does so for its own trainers; the script makes every baseline do so on older TRL too."""
    from datasets import Dataset
    from helpers import geometry3k_rows

    from riskpo_trl import tracks as data  # the script reads the registries with every track in
    from riskpo_trl.multimodal import build_tiny_vlm, geometry3k_to_riskpo

    build_tiny_vlm(tmp_path / "tiny-vlm")
    rows = Dataset.from_list([geometry3k_to_riskpo(row) for row in geometry3k_rows(8)])
    monkeypatch.setattr(data, "load_train_dataset", lambda *args, **kwargs: rows)
    recipe = ROOT / f"recipes/Qwen2.5-Math-1.5B-Instruct/{trainer_name}/config_math_gsm8k.yaml"
    args = train.parse_args(
        [
            "--config",
            str(recipe),
            "--model_name_or_path",
            str(tmp_path / "tiny-vlm"),
            "--output_dir",
            str(tmp_path / "run"),
            "--use_vllm",
            "false",
            "--use_cpu",
            "true",
            "--bf16",
            "false",
            "--dtype",
            "float32",
            "--gradient_checkpointing",
            "false",
            "--report_to",
            "none",
            "--eval_strategy",
            "no",
            "--num_generations",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            "1",
            "--steps_per_generation",
            "1",
            "--max_completion_length",
            "8",
            "--reward_funcs",
            "geometry_accuracy",
        ]
    )
    trainer = train.build_trainer(*args)
    assert trainer.generation_kwargs["suppress_tokens"] == [trainer.model.config.image_token_id]
