"""Resume refuses a damaged riskpo_state.json by name and field, and a checkpoint that predates recorded risk settings
goes on with the advantage it was trained with (the paper's, advantage_baseline='none'), saying so."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.risk import ADVANTAGE_BASELINES
from riskpo_trl.trainer.riskpo_trainer import RISK_STATE_FILE


def config(output_dir, **overrides) -> RiskPOConfig:
    settings = dict(
        output_dir=str(output_dir),
        max_steps=1,
        max_completion_length=16,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-3,
        gradient_checkpointing=False,
        seed=7,
        steps_per_generation=5,
    )
    settings.update(overrides)
    return tiny_config(settings.pop("output_dir"), run=False, **settings)


def trainer(tiny_model_dir, args) -> RiskPOTrainer:
    return RiskPOTrainer(
        tiny_model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset()
    )


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    """A checkpoint after one step, written by a run that states nothing about the baseline."""
    root = tmp_path_factory.mktemp("resume-state")
    trainer(tiny_model_dir, config(root / "run", save_strategy="steps", save_steps=1)).train()
    path = root / "run" / "checkpoint-1"
    state = json.loads((path / RISK_STATE_FILE).read_text())
    assert state["quantile_tracker"]["num_updates"] >= 1 and len(state["quantile_tracker"]["values"]) == 2
    return path


def edited_copy(checkpoint, tmp_path, edit):
    """A copy of ``checkpoint`` whose riskpo_state.json went through ``edit`` (a function of the parsed state)."""
    copy = tmp_path / "checkpoint-1"
    shutil.copytree(checkpoint, copy)
    state = json.loads((copy / RISK_STATE_FILE).read_text())
    edit(state)
    (copy / RISK_STATE_FILE).write_text(json.dumps(state))  # NaN and inf as JSON's NaN and Infinity tokens
    return copy


def set_tracker(field, value):
    return lambda state: state["quantile_tracker"].__setitem__(field, value)


@pytest.mark.parametrize(
    "edit, field",
    [
        (set_tracker("values", [float("nan"), 0.5]), "values"),
        (set_tracker("values", [0.1, float("inf")]), "values"),
        (set_tracker("values", [0.5]), "values"),
        (set_tracker("values", [0.9, 0.1]), "values"),
        (set_tracker("num_updates", 0), "num_updates"),
        (lambda state: state["quantile_tracker"].pop("num_updates"), "num_updates"),
        (set_tracker("values", [-1e300, 1e300]), "values"),
        (set_tracker("values", [-(10**400), 0.5]), "values"),
        (set_tracker("num_updates", 10**400), "num_updates"),
        (set_tracker("num_updates", 10**6), "num_updates"),
        (set_tracker("score_range", [1.0, 0.0]), "score_range"),
        (lambda state: state["regime_guard"].__setitem__("streak", -5), "streak"),
        (lambda state: state["regime_guard"].__setitem__("warned", "false"), "warned"),
    ],
    ids=[
        "nan",
        "inf",
        "one_level",
        "unordered",
        "zero_updates",
        "no_update_count",
        "far_outside_the_rewards",
        "400_digit_integer",
        "400_digit_update_count",
        "more_updates_than_steps",
        "reversed_score_range",
        "negative_streak",
        "warned_as_a_string",
    ],
)
def test_a_damaged_tracker_state_is_refused_naming_the_file_and_field(
    tiny_model_dir, checkpoint, tmp_path, edit, field
):
    damaged = edited_copy(checkpoint, tmp_path, edit)
    resumed = trainer(tiny_model_dir, config(tmp_path / "resumed", max_steps=2))
    with pytest.raises(ValueError, match=rf"{RISK_STATE_FILE}.*'{field}'"):
        resumed.train(resume_from_checkpoint=str(damaged))
    assert resumed.state.global_step <= 1  # refused before any training step


def test_a_checkpoint_without_recorded_settings_resumes_with_the_papers_advantage(
    tiny_model_dir, checkpoint, tmp_path, caplog
):
    old = edited_copy(checkpoint, tmp_path, lambda state: state.pop("settings"))
    args = config(tmp_path / "resumed", max_steps=2)
    assert args.advantage_baseline is None  # unset: today's default, "loo", for a config that does not state it
    resumed = trainer(tiny_model_dir, args)
    with caplog.at_level(logging.INFO, logger="riskpo_trl"):
        resumed.train(resume_from_checkpoint=str(old))
    assert resumed.state.global_step == 2
    assert resumed.args.advantage_baseline == resumed.risk_estimator.choices.advantage_baseline == "none"
    assert resumed.risk_estimator.rule.baseline is ADVANTAGE_BASELINES.get("none")  # the behaviour, not only the name
    assert "advantage_baseline='none'" in caplog.text and "written before checkpoints recorded" in caplog.text


def test_a_stated_baseline_wins_over_an_old_checkpoint(tiny_model_dir, checkpoint, tmp_path, capsys):
    old = edited_copy(checkpoint, tmp_path, lambda state: state.pop("settings"))
    resumed = trainer(tiny_model_dir, config(tmp_path / "resumed", max_steps=2, advantage_baseline="loo"))
    resumed.train(resume_from_checkpoint=str(old))
    assert resumed.args.advantage_baseline == resumed.risk_estimator.choices.advantage_baseline == "loo"
    assert resumed.risk_estimator.rule.baseline is ADVANTAGE_BASELINES.get("loo")
    # on the console at the default log level, as docs/training.md promises
    assert f"Resumed from {old} with advantage_baseline='loo'." in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "fifo", "3 GB sparse file"])
def test_a_state_file_that_is_not_a_small_regular_file_is_refused_by_name(tiny_model_dir, checkpoint, tmp_path, kind):
    """Read whole, these would exhaust memory (/dev/zero, a sparse file) or block start-up for ever (a FIFO)."""
    damaged = edited_copy(checkpoint, tmp_path, lambda state: None)
    path = damaged / RISK_STATE_FILE
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind.startswith("symlink"):
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as file:
            file.truncate(3 * 10**9)
    resumed = trainer(tiny_model_dir, config(tmp_path / "resumed", max_steps=2))
    with pytest.raises(ValueError, match=rf"{path} (is a|holds 3000000000 bytes).*not read"):
        resumed.train(resume_from_checkpoint=str(damaged))
    assert resumed.state.global_step <= 1


def test_an_optimizer_state_loads_onto_an_indexed_cpu_device(tmp_path):
    """What transformers asks for when a multi-process CPU run resumes (``map_location=args.device``, ``cpu:0``):
    torch alone refuses it; after `accept_indexed_cpu_locations` the state loads, on the CPU, unchanged. The 2-process
    resume itself runs in the real-vLLM venv (transformers 5.17), test_vllm_real_server.py."""
    import subprocess
    import sys

    probe = (
        "import sys, torch\n"
        "from riskpo_trl.job.checkpoint_guards import accept_indexed_cpu_locations\n"
        "state = {'exp_avg': torch.arange(4.0)}\n"
        "torch.save(state, sys.argv[1])\n"
        "try:\n"
        "    torch.load(sys.argv[1], map_location='cpu:0', weights_only=True)\n"
        "    print('torch alone loads it')\n"
        "except RuntimeError as error:\n"
        "    assert 'tagged with cpu:0' in str(error), error\n"
        "accept_indexed_cpu_locations()\n"
        "for device in ('cpu:0', torch.device('cpu', 1)):\n"
        "    loaded = torch.load(sys.argv[1], map_location=device, weights_only=True)\n"
        "    assert loaded['exp_avg'].device.type == 'cpu' and torch.equal(loaded['exp_avg'], state['exp_avg'])\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "optimizer.pt")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.splitlines() == ["ok"], result.stdout + result.stderr
