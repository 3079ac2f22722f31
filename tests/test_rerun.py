"""Re-running a command is exact: a finished run says so and trains nothing, a resume restores exactly what was
saved (tied embeddings included, without a 'missing keys' warning), and checkpoints that fall inside a generation
batch are warned about when the config is built."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from riskpo_trl import RiskPOTrainer, job
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


def command(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "--config",
        str(TINY_RECIPE),
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


def checkpoints(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("finished")
    train.cli(command(tmp_path, "--max_steps", "2", "--save_steps", "1"))
    return tmp_path


@pytest.mark.slow
def test_rerunning_a_finished_command_trains_nothing_and_says_so(finished_run, capsys):
    tmp_path = finished_run
    before = (tmp_path / "run" / "trainer_state.json").read_text()
    capsys.readouterr()
    train.cli(command(tmp_path, "--max_steps", "2", "--save_steps", "1"))  # returns: exit code 0
    out = capsys.readouterr().out
    assert re.search(
        r"Nothing to train: the run in .*run is finished \(.*checkpoint-2 is at step 2 of max_steps=2\)", out
    )
    assert checkpoints(tmp_path) == ["checkpoint-1", "checkpoint-2"]
    assert (tmp_path / "run" / "trainer_state.json").read_text() == before


@pytest.mark.slow
def test_a_run_killed_after_its_last_checkpoint_gets_its_final_save_back(finished_run):
    tmp_path = finished_run
    run = tmp_path / "run"
    for name in ("model.safetensors", "config.json", "trainer_state.json"):
        (run / name).unlink()
    assert train.main(*train.parse_args(command(tmp_path, "--max_steps", "2", "--save_steps", "1"))) is None
    assert checkpoints(tmp_path) == ["checkpoint-1", "checkpoint-2"]
    assert load_file(run / "model.safetensors").keys() == load_file(run / "checkpoint-2" / "model.safetensors").keys()
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2
    AutoModelForCausalLM.from_pretrained(run)


@pytest.mark.slow
def test_raising_max_steps_continues_at_the_new_schedules_learning_rate(tmp_path, caplog):
    """A finished linear decay ends at learning rate 0; continuing to a larger max_steps trains step N+1 at the new
    schedule's value at step N, learning_rate x (new max_steps - N) / new max_steps without warmup (docs/training.md),
    and says so before it trains."""
    schedule = ("--learning_rate", "1e-4", "--lr_scheduler_type", "linear", "--warmup_steps", "0", "--save_steps", "1")
    train.cli(command(tmp_path, "--max_steps", "2", *schedule))
    with caplog.at_level(logging.WARNING):
        train.cli(command(tmp_path, "--max_steps", "4", *schedule))
    assert "Continuing from step 2 with max_steps=4: the learning-rate schedule is the one for 4 steps" in caplog.text
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    rates = {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}
    assert rates[1] == pytest.approx(1e-4) and rates[2] == pytest.approx(0.5e-4)  # the first run's 2-step decay
    assert rates[3] == pytest.approx(1e-4 * (4 - 2) / 4) and rates[4] == pytest.approx(1e-4 * (4 - 3) / 4)


@pytest.mark.slow
def test_an_epoch_based_run_is_finished_after_its_epochs(tmp_path):
    # 4 examples in generation batches of 2 prompts: 2 steps per epoch, checkpoints at each.
    epochs = command(
        tmp_path, "--max_steps", "-1", "--num_train_epochs", "1", "--max_train_samples", "4", "--save_steps", "1"
    )
    train.cli(epochs)
    assert checkpoints(tmp_path) == ["checkpoint-1", "checkpoint-2"]
    assert train.main(*train.parse_args(epochs)) is None
    more = train.main(
        *train.parse_args(
            command(
                tmp_path,
                "--max_steps",
                "-1",
                "--num_train_epochs",
                "2",
                "--max_train_samples",
                "4",
                "--save_steps",
                "1",
            )
        )
    )
    assert more.state.global_step == 4


@pytest.mark.slow
@pytest.mark.parametrize("baseline", [False, True], ids=["riskpo", "trl-grpo"])
def test_resuming_a_tied_embeddings_model_restores_the_saved_weights_quietly(finished_run, tmp_path, baseline):
    """transformers lists a tied LM head as missing when it loads a checkpoint (the weight is stored once); the job
    layer's checkpoint guards keep its warning for real gaps, for RiskPO and for TRL's own GRPOTrainer alike."""
    from trl import GRPOConfig, GRPOTrainer

    checkpoint = finished_run / "run" / "checkpoint-1"
    layout = dict(
        num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=1, max_steps=1, report_to="none"
    )
    layout.update(use_cpu=True, bf16=False)
    if baseline:
        trainer_class, args = GRPOTrainer, GRPOConfig(str(tmp_path), **layout)
    else:
        trainer_class = RiskPOTrainer
        args = tiny_config(tmp_path, run=False, bundle_size=2, steps_per_generation=1, **layout)
    trainer = trainer_class(
        str(finished_run / "tiny-model"),
        reward_funcs=contains_digit_reward,
        args=args,
        train_dataset=make_prompt_dataset(),
    )
    saved = load_file(checkpoint / "model.safetensors")
    assert "lm_head.weight" not in saved  # stored once, as the embedding
    for guarded in (False, True):
        if guarded:
            job.prepare(trainer)
        with torch.no_grad():  # so that only the load can bring the saved values back
            for parameter in trainer.model.parameters():
                parameter.fill_(0.5)
        with CaptureLogger(hf_logging.get_logger("transformers.trainer")) as captured:
            trainer._load_from_checkpoint(str(checkpoint))
        assert ("missing keys" in captured.out) is not guarded, captured.out
        state = trainer.model.state_dict()
        for name, tensor in saved.items():
            assert torch.equal(state[name], tensor), name
        assert torch.equal(state["lm_head.weight"], saved["model.embed_tokens.weight"])


def test_checkpoints_inside_a_generation_batch_warn_with_the_multiple_to_use(tmp_path):
    # The default: 4 optimizer updates per generation batch.
    with pytest.warns(UserWarning, match="Make save_steps a multiple of 4"):
        tiny_config(tmp_path, run=False, save_steps=6)
    # A fraction of max_steps is a step count too: 0.1 x 30 = 3 updates.
    with pytest.warns(UserWarning, match="save_steps=0.1 .*every 3 optimizer steps.*a multiple of 4"):
        tiny_config(tmp_path, run=False, save_steps=0.1, max_steps=30)
