"""End-to-end runs of riskpo_trl.scripts.train on the tiny CPU recipe: resume after a kill, reload, model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from riskpo_trl.plots import find_trainer_state, load_run
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_GRPO_RECIPE = ROOT / "recipes/tiny/grpo/config_tiny_arithmetic.yaml"


def run(tmp_path: Path, *overrides: str, recipe: Path = TINY_RECIPE):
    args = train.parse_args(
        [
            "--config", str(recipe),
            "--model_name_or_path", str(tmp_path / "tiny-model"),
            "--output_dir", str(tmp_path / "run"),
            "--dataset_files", str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
            "--max_completion_length", "8",
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


@pytest.mark.slow
def test_rerun_resumes_from_last_checkpoint(resumed_run):
    tmp_path, first_history, second = resumed_run
    assert second.state.global_step == 4
    # The restored state carries the first run's logs for steps 1-2, and the quantile trackers' two updates.
    steps = [entry["step"] for entry in second.state.log_history if "loss" in entry]
    assert steps == [1, 2, 3, 4]
    assert [e for e in second.state.log_history if e["step"] <= 2 and "loss" in e] == [
        e for e in first_history if "loss" in e
    ]
    assert second.quantile_tracker.num_updates == 4
    saved = json.loads((tmp_path / "run/checkpoint-4/riskpo_state.json").read_text())
    assert saved["quantile_tracker"] == second.quantile_tracker.state_dict()


@pytest.mark.slow
def test_output_reloads_and_card_names_riskpo(resumed_run):
    tmp_path, _, _ = resumed_run
    output_dir = tmp_path / "run"
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert model.config.model_type == "qwen2" and tokenizer.chat_template
    card = (output_dir / "README.md").read_text()
    assert "RiskPO" in card
    assert "2510.00911" in card  # the paper
    assert "- riskpo" in card and "- trl" in card  # tags in the card's metadata
    assert "openai/gsm8k" in card  # the dataset's Hub id


@pytest.mark.slow
def test_grpo_baseline_trains_through_the_same_script(tmp_path):
    trainer = run(tmp_path, "--loss_type", "dr_grpo", "--max_steps", "1", "--save_strategy", "no",
                  recipe=TINY_GRPO_RECIPE)
    assert type(trainer).__name__ == "GRPOTrainer"
    assert trainer.args.loss_type == "dr_grpo" and not hasattr(trainer.args, "bundle_size")
    assert trainer.state.global_step == 1
    # No checkpoint was saved, yet the log history the plots read is in output_dir.
    state_file = tmp_path / "run" / "trainer_state.json"
    assert state_file.is_file() and not list((tmp_path / "run").glob("checkpoint-*"))
    assert find_trainer_state(tmp_path / "run") == state_file
    run_logs = load_run(str(tmp_path / "run"))
    assert run_logs.name == "run" and any("loss" in entry for entry in run_logs.log_history)
