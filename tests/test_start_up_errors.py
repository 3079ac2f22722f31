"""Mistakes fail early and clearly: from the console scripts as one ``error:`` line with exit code 2 (the recipe file
and field when the value came from a recipe; a traceback only with ``--debug``), from Python with the closest name."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config

from riskpo_trl import RiskPOTrainer, job
from riskpo_trl.scripts import eval as eval_script
from riskpo_trl.scripts import plot, train

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_DATA = ROOT / "examples/data/tiny_arithmetic.jsonl"


def run_cli(cli, argv, capsys) -> str:
    """stderr of a console script that must stop with exit code 2 and a single 'error:' line, no traceback."""
    with pytest.raises(SystemExit) as exit:
        cli(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    return line


def write_recipe(tmp_path: Path, text: str) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model_name_or_path: {tmp_path / 'tiny'}\nbuild_tiny_model: true\n" + text)
    return recipe


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("max_steps: 6.5", "max_steps: expected an integer, got 6.5"),
        ("bundle_size: five", "bundle_size: expected an integer, got 'five'"),
        ("use_cpu: maybe", "use_cpu: expected true or false, got 'maybe'"),
        ("learning_rate: fast", "learning_rate: expected a number, got 'fast'"),
        ("risk_profile: safest", "risk_profile: expected one of ['mvar', 'rvar', 'risk_seeking'], got 'safest'"),
    ],
)
def test_a_bad_recipe_value_names_the_file_and_field(tmp_path, capsys, field, expected):
    recipe = write_recipe(tmp_path, field + "\n")
    line = run_cli(train.cli, ["--config", str(recipe)], capsys)
    assert line == f"riskpo-train: error: {recipe}: {expected}"
    assert not (tmp_path / "tiny").exists()  # nothing was built or loaded


def test_a_config_validation_error_names_the_recipe_field(tmp_path, capsys):
    recipe = write_recipe(tmp_path, "bundle_size: 0\n")
    line = run_cli(train.cli, ["--config", str(recipe), "--bf16", "false"], capsys)
    assert line.startswith(f"riskpo-train: error: {recipe}: bundle_size: bundle_size=0 must be >= 1")
    # The same mistake on the command line is not blamed on the recipe.
    line = run_cli(train.cli, ["--config", str(recipe), "--bf16", "false", "--bundle_size", "0"], capsys)
    assert line.startswith("riskpo-train: error: --bundle_size (command line): bundle_size=0 must be >= 1")


def test_a_command_line_flag_that_breaks_the_batch_layout_is_blamed_not_the_recipe_field(capsys):
    """The layout error names num_generations (set by the recipe) before bundle_size; the flag is the change."""
    line = run_cli(train.cli, ["--config", str(TINY_RECIPE), "--bundle_size", "3"], capsys)
    assert line.startswith("riskpo-train: error: --bundle_size (command line): A generation batch holds 2 prompts")
    assert "num_generations:" not in line


def test_a_bad_command_line_value_is_one_line_without_the_usage_dump(tmp_path, capsys):
    line = run_cli(train.cli, ["--config", str(TINY_RECIPE), "--max_steps", "abc"], capsys)
    assert line.startswith("riskpo-train: error: argument --max_steps") and "invalid int value: 'abc'" in line


def test_an_unknown_field_says_where_it_came_from(tmp_path, capsys):
    recipe = write_recipe(tmp_path, "risk_omgea: 0.5\n")
    line = run_cli(train.cli, ["--config", str(recipe)], capsys)
    assert f"in {recipe}: risk_omgea (did you mean risk_omega?)" in line


def test_debug_shows_the_traceback(tmp_path):
    recipe = write_recipe(tmp_path, "bundle_size: 0\n")
    with pytest.raises(ValueError, match="bundle_size=0 must be >= 1"):
        train.cli(["--config", str(recipe), "--bf16", "false", "--debug"])


def test_an_empty_dataset_file_is_named(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    line = run_cli(
        train.cli,
        [
            "--config",
            str(TINY_RECIPE),
            "--model_name_or_path",
            str(tmp_path / "tiny"),
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_files",
            str(empty),
        ],
        capsys,
    )
    assert f"Dataset file {empty} is empty" in line
    assert not (tmp_path / "run" / "README.md").exists()


def test_a_crash_during_training_keeps_its_traceback(tmp_path, monkeypatch):
    """Only start-up mistakes become one line: an error raised by training itself propagates."""

    def crash(self, *args, **kwargs):
        raise ValueError("a bug inside training")

    monkeypatch.setattr(RiskPOTrainer, "train", crash)
    with pytest.raises(ValueError, match="a bug inside training"):
        train.cli(
            [
                "--config",
                str(TINY_RECIPE),
                "--model_name_or_path",
                str(tmp_path / "tiny"),
                "--output_dir",
                str(tmp_path / "run"),
                "--dataset_files",
                str(TINY_DATA),
            ]
        )


def test_eval_and_plot_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    line = run_cli(plot.cli, ["curves", str(tmp_path / "no-such-run")], capsys)
    assert line.startswith("riskpo-plot: error:")
    line = run_cli(eval_script.cli, ["--model", str(tmp_path / "m"), "--benchmarks", "aime24", "--ks", "0"], capsys)
    assert line.startswith("riskpo-eval: error:")


def test_python_api_suggests_the_closest_field_for_a_misspelled_keyword(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bundel_size' \(did you mean bundle_size\?\)"):
        tiny_config(tmp_path, run=False, bundel_size=2)
    args = tiny_config(
        tmp_path,
        run=False,
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        bundle_size=2,
    )
    with pytest.raises(TypeError, match=r"'train_datset' \(did you mean train_dataset\?\)"):
        job.build(
            RiskPOTrainer,
            str(tmp_path / "no-model"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_datset=make_prompt_dataset(),
        )


def test_misspelled_names_get_the_closest_valid_one():
    from riskpo_trl.code.data import load_livecodebench
    from riskpo_trl.data.datasets import load_benchmark
    from riskpo_trl.evaluation.benchmarks import check_benchmark_names
    from riskpo_trl.evaluation.config import EvalConfig
    from riskpo_trl.rewards.registry import get_reward_funcs

    with pytest.raises(
        ValueError, match=r"reward_funcs='math_verfy' is unknown \(did you mean math_verify\?\); choose"
    ):
        get_reward_funcs(["boxed_format", "math_verfy"])
    with pytest.raises(ValueError, match=r"benchmark='math5000' is unknown \(did you mean math500\?\); choose"):
        load_benchmark("math5000")
    with pytest.raises(ValueError, match=r"benchmark='aime2S' is unknown \(did you mean aime25\?\); choose"):
        check_benchmark_names(EvalConfig(model="a-model", benchmarks=["aime2S"]))
    with pytest.raises(ValueError, match=r"release='release_v55' is unknown \(did you mean release_v5\?\)"):
        load_livecodebench(release="release_v55")
    # nothing close: no guess
    with pytest.raises(ValueError, match=r"reward_funcs='zzz' is unknown; choose"):
        get_reward_funcs(["zzz"])
    # several: one message naming each, with the hint for each close one
    with pytest.raises(
        ValueError,
        match=r"reward_funcs \['zzz', 'boxed_formt'\] are unknown \(did you mean "
        r"boxed_format for boxed_formt\?\); choose one of \['math_verify'",
    ):
        get_reward_funcs(["zzz", "math_verify", "boxed_formt"])


def test_trls_reward_names_get_ours(tmp_path, capsys):
    import trl.rewards

    from riskpo_trl.rewards.registry import REWARD_FUNCS, TRL_REWARD_NAMES

    line = run_cli(
        train.cli,
        ["--config", str(TINY_RECIPE), "--output_dir", str(tmp_path / "run"), "--reward_funcs", "accuracy_reward"],
        capsys,
    )
    assert "reward_funcs='accuracy_reward' is unknown (did you mean trl_accuracy?); choose one of" in line
    assert not (tmp_path / "run").exists()
    # each TRL name offered is the very function registered under our name
    for trl_name, ours in TRL_REWARD_NAMES.items():
        assert getattr(trl.rewards, trl_name) is REWARD_FUNCS[ours]


def test_an_unknown_loss_type_fails_when_the_config_is_built_not_at_the_first_step(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"loss_type='grop' is unknown \(did you mean grpo\?\); choose one of"):
        tiny_config(tmp_path, run=False, loss_type="grop")
    recipe = write_recipe(tmp_path, "loss_type: foo\n")
    line = run_cli(train.cli, ["--config", str(recipe), "--bf16", "false"], capsys)
    assert line.startswith(f"riskpo-train: error: {recipe}: loss_type: loss_type='foo' is unknown; choose one of")
    assert not (tmp_path / "tiny").exists()  # nothing was built or loaded


def test_a_baseline_trainer_refuses_an_unknown_loss_type_before_it_loads_the_model(tmp_path):
    from trl import GRPOConfig

    from riskpo_trl.trainer.registry import TRAINERS

    _, trainer_class = TRAINERS.get("grpo")()
    args = GRPOConfig(
        output_dir=str(tmp_path), loss_type="dr-grpo", per_device_train_batch_size=4, num_generations=2, use_cpu=True
    )
    with pytest.raises(ValueError, match=r"loss_type='dr-grpo' is unknown \(did you mean dr_grpo\?\)"):
        job.build(
            trainer_class,
            str(tmp_path / "no-model"),
            reward_funcs=contains_digit_reward,
            args=args,
            train_dataset=make_prompt_dataset(),
        )
