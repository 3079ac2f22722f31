"""A training run's console: the known warning walls silenced, the risk metrics on one line per logging step."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
from helpers import tiny_config

from riskpo_trl.risk import RISK_PROFILES
from riskpo_trl.scripts.console import compact_log_line, use_compact_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_compact_line_shows_the_risk_metrics_and_skips_empty_ones():
    logs = {
        "loss": 0.09,
        "reward": 0.5,
        "risk/q_alpha": 0.02,
        "risk/q_beta": 0.08,
        "risk/upper_rvar": None,
        "learning_rate": 5e-5,
        "entropy": 4.6,
    }
    assert compact_log_line(logs, 2, 6) == (
        "[step 2/6] loss 0.09, reward 0.5 | risk: q_alpha 0.02, q_beta 0.08 | lr 5e-05"
    )
    evaluation = {"eval_loss": 0.1, "eval_reward": 0.5, "eval_risk/mvar": -0.5}
    mvar = RISK_PROFILES["mvar"].metric
    assert compact_log_line(evaluation, 4, 6, mvar) == "[eval step 4/6] loss 0.1, reward 0.5 | risk: mvar -0.5"
    seeking = {"loss": 0.1, "reward": 0.5, "risk/risk_seeking": 1.5}  # each profile logs its own objective
    line = compact_log_line(seeking, 1, 6, RISK_PROFILES["risk_seeking"].metric)
    assert line == "[step 1/6] loss 0.1, reward 0.5 | risk: risk_seeking 1.5"
    # A profile the console has never heard of shows by the metric its registry entry names.
    assert compact_log_line({"loss": 0.1, "risk/mean": 2.0}, 1, 6, "risk/mean") == "[step 1/6] loss 0.1 | risk: mean 2"
    assert compact_log_line({"train_runtime": 3.0}, 6, 6) is None  # the run summary prints as before
    baseline = {"loss": 0.1, "reward": 0.25, "learning_rate": 1e-4}
    assert compact_log_line(baseline, 1, 6) == "[step 1/6] loss 0.1, reward 0.25 | lr 0.0001"
    # A step that reuses its generation batch logs no reward: still one line, not TRL's raw dict.
    reuse = {"loss": 0.01, "grad_norm": 0.3, "learning_rate": 1e-4, "clip_ratio/region_mean": 0.0, "epoch": 0.1}
    assert compact_log_line(reuse, 2, 6) == "[step 2/6] loss 0.01 | lr 0.0001"


def test_float_noise_prints_as_zero_and_numbers_to_four_significant_digits():
    logs = {
        "loss": 2.776e-17,
        "reward": 0.123456,
        "risk/q_alpha": -3e-13,
        "risk/q_beta": 1.5e-9,
        "learning_rate": 1.23456e-4,
    }
    assert compact_log_line(logs, 3, 6) == (
        "[step 3/6] loss 0, reward 0.1235 | risk: q_alpha 0, q_beta 1.5e-09 | lr 0.0001235"
    )


def test_the_run_summary_prints_numbers_not_strings():
    """The summary line (no loss or reward: the compact line does not cover it) goes through the same format."""
    from transformers.trainer_callback import ProgressCallback, TrainerControl, TrainerState

    written = []

    class Trainer:  # the two methods use_compact_log calls
        def __init__(self):
            self.callbacks = [ProgressCallback()]

        def pop_callback(self, kind):
            return self.callbacks.pop() if self.callbacks else None

        def add_callback(self, kind):
            self.callbacks.append(kind())

    trainer = Trainer()
    use_compact_log(trainer)
    [callback] = trainer.callbacks
    callback.training_bar = type("Bar", (), {"write": staticmethod(written.append)})()
    summary = {
        "train_runtime": 12.3456,
        "train_samples_per_second": 0.648,
        "train_loss": 2.776e-17,
        "total_flos": 1234.0,
        "epoch": 3.0,
    }
    callback.on_log(None, TrainerState(), TrainerControl(), logs=summary)
    assert written == ["train_runtime 12.35, train_samples_per_second 0.648, train_loss 0, epoch 3"]


def test_importing_the_library_changes_no_warning_filter():
    """The filters are the script's choice (riskpo-train installs them); importing riskpo_trl installs none."""
    code = (
        "import warnings, trl, transformers; from trl import GRPOTrainer; before = list(warnings.filters); "
        "import riskpo_trl.trainer.riskpo_trainer, riskpo_trl.trainer.config, riskpo_trl.rewards.registry; "
        "assert warnings.filters == before, [f for f in warnings.filters if f not in before]"
    )
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_only_the_known_warnings_are_silenced():
    """What riskpo-train installs for the whole run."""
    from riskpo_trl.job.library_warnings import drop_deepspeed_cpu_notice, ignore_library_default_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drop_deepspeed_cpu_notice()
        ignore_library_default_warnings()
        warnings.warn("`gradient_checkpointing_enable` is deprecated and will be removed in v6. Use x.", FutureWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use x.", FutureWarning)
        warnings.warn("`other_argument` is deprecated and will be removed in v6.", FutureWarning)
    assert [str(w.message) for w in caught] == ["`other_argument` is deprecated and will be removed in v6."]

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    deepspeed_logger = logging.getLogger("DeepSpeed")
    deepspeed_logger.addHandler(handler)
    try:
        deepspeed_logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were ...")
        deepspeed_logger.warning("Something else DeepSpeed says")
    finally:
        deepspeed_logger.removeHandler(handler)
    assert [record.getMessage() for record in records] == ["Something else DeepSpeed says"]


@pytest.mark.slow
def test_tiny_run_console_has_the_risk_line_no_warning_walls_and_an_honest_card(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "riskpo_trl.scripts.train",
        "--config",
        os.path.join(ROOT, "recipes", "tiny", "riskpo", "config_tiny_arithmetic.yaml"),
        "--dataset_files",
        os.path.join(ROOT, "examples", "data", "tiny_arithmetic.jsonl"),
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(tmp_path / "tiny-run"),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
        "--max_completion_length",
        "8",
        "--steps_per_generation",
        "2",  # step 2 reuses step 1's generation batch: it logs no reward
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "[step 1/2] loss" in output and "[step 2/2] loss" in output
    assert "| risk: q_alpha" in output
    assert ", mvar " in output  # the run's profile's objective, by the metric its registry entry names
    assert "'risk/q_alpha'" not in output and "{'loss'" not in output  # each step's dict is replaced by its line
    assert "Setting accelerator to CPU" not in output
    assert "gradient_checkpointing" not in output
    # The script's card: the run's own name, no Hub ids for a local model and a local file.
    card = (tmp_path / "tiny-run" / "README.md").read_text()
    assert "# Model Card for tiny-run" in card and "None" not in card
    assert "openai/gsm8k" not in card and "`tiny_arithmetic.jsonl`" in card


# --- a user script: the same warnings silenced, only while the trainer builds and trains

LIBRARY_DEFAULT_MESSAGES = ("gradient_checkpointing", "'pin_memory' argument is set as true")


def library_default_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if any(text in str(w.message) for text in LIBRARY_DEFAULT_MESSAGES)]


def test_a_user_script_hears_no_library_default_warning_and_keeps_its_filters(tiny_model_dir, tmp_path):
    """Through the job layer (riskpo_trl.job.build and train) the libraries' notices are silenced within the calls
    only; a trainer built and trained directly is TRL's: it changes no filter and hides no warning."""
    from helpers import contains_digit_reward, make_prompt_dataset

    from riskpo_trl import RiskPOConfig, RiskPOTrainer, job

    def run(through_job: bool, output_dir) -> list:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            filters = list(warnings.filters)
            args = RiskPOConfig(
                output_dir=str(output_dir),
                max_steps=1,
                num_generations=4,
                per_device_train_batch_size=8,
                gradient_accumulation_steps=1,
                bundle_size=2,
                max_completion_length=4,
                report_to="none",
                dataloader_pin_memory=True,
            )
            kwargs = dict(reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(8))
            if through_job:
                job.train(job.build(RiskPOTrainer, tiny_model_dir, **kwargs))
            else:
                RiskPOTrainer(tiny_model_dir, **kwargs).train()
            assert warnings.filters == filters  # scoped: the script's own filters are back
        return library_default_warnings(caught)

    assert run(True, tmp_path / "job") == []
    assert run(False, tmp_path / "direct") != []  # what TRL says to its own users, unfiltered


def test_a_field_the_user_set_keeps_its_deprecation_warning(tmp_path):
    from trl import GRPOConfig

    with warnings.catch_warnings(record=True) as library:
        warnings.simplefilter("always")
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=True)
    if not any("`gradient_checkpointing` is deprecated" in message for message in library_default_warnings(library)):
        pytest.skip("the installed transformers/TRL does not deprecate gradient_checkpointing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_config(tmp_path, run=False, use_cpu=True, gradient_checkpointing=True)
    assert any("`gradient_checkpointing` is deprecated" in message for message in library_default_warnings(caught))


def test_importing_the_config_leaves_deepspeeds_logger_as_it_is():
    """No process-wide state on import: DeepSpeed's CPU notice is dropped by riskpo-train's set-up (above), not by
    importing the config or building a trainer in a notebook."""
    code = (
        "import logging, sys; records = []; handler = logging.Handler(); handler.emit = records.append; "
        "logging.getLogger('DeepSpeed').addHandler(handler); import riskpo_trl; riskpo_trl.RiskPOConfig; "
        "logging.getLogger('DeepSpeed').warning('Setting accelerator to CPU. If you have GPU ...'); "
        "print(len(records), logging.getLogger('DeepSpeed').filters)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip().splitlines()[-1] == "1 []", result.stderr[-2000:]
