"""Every console script answers --help with its options, without importing torch, TRL or transformers (what makes
--help slow); its timing is measured by benchmarks/cli_startup.py, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli_startup import console_scripts

ROOT = Path(__file__).resolve().parents[1]


CONSOLE_SCRIPTS = console_scripts(ROOT / "pyproject.toml")
HEAVY_MODULES = ("torch", "transformers", "trl", "datasets", "accelerate")
# Options each script's --help must list.
EXPECTED_OPTIONS = {
    "riskpo-train": [
        "--config",
        "--trainer",
        "--dataset_name",
        "--reward_funcs",
        "--help-all",
        "--model_name_or_path",
        "--advantage_baseline",
        "'math_verify'",
        "'verl_by_source'",
        "'code'",
    ],
    "riskpo-eval": ["--model", "--benchmarks", "--num_samples", "--ks", "--backend"],
    "riskpo-plot": ["curves", "logprob"],
}

HELP_PROBE = """
import sys
module, function = sys.argv[1].split(":")
sys.argv = [sys.argv[2], "--help"]
try:
    getattr(__import__(module, fromlist=[function]), function)()
    code = 0
except SystemExit as exit:
    code = exit.code or 0
heavy = [name for name in {heavy!r} if name in sys.modules]
print("PROBE", code, ",".join(heavy))
"""


def test_every_console_script_is_covered():
    assert set(CONSOLE_SCRIPTS) == set(EXPECTED_OPTIONS)
    assert all(target.startswith("riskpo_trl.scripts.") for target in CONSOLE_SCRIPTS.values())


@pytest.mark.parametrize("name", sorted(EXPECTED_OPTIONS))
def test_help_lists_the_options_without_heavy_imports(name):
    result = subprocess.run(
        [sys.executable, "-c", HELP_PROBE.format(heavy=HEAVY_MODULES), CONSOLE_SCRIPTS[name], name],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    probe = result.stdout.strip().splitlines()[-1].split(" ")
    assert probe[:2] == ["PROBE", "0"], result.stdout
    assert probe[2:] in ([], [""]), f"--help imported {probe[2:]}"
    for option in EXPECTED_OPTIONS[name]:
        assert option in result.stdout, option


@pytest.mark.parametrize(
    ("trainer", "listed", "absent"), [("riskpo", "--bundle_size", None), ("grpo", "--loss_type", "--bundle_size")]
)
def test_train_help_all_lists_the_chosen_trainers_config_fields(capsys, trainer, listed, absent):
    from riskpo_trl.scripts import train

    with pytest.raises(SystemExit) as exit:
        train.parse_args(["--help-all", "--trainer", trainer])
    assert exit.value.code == 0
    printed = capsys.readouterr().out
    assert listed in printed and "--model_name_or_path" in printed
    assert absent is None or absent not in printed


# --- mistakes at --help speed: checked against the generated option list before torch, transformers or TRL load

TYPO_PROBE = """
import sys
from riskpo_trl.scripts.train import cli
try:
    cli(sys.argv[1:])
except SystemExit as exit:
    print("PROBE", exit.code, ",".join(name for name in {heavy!r} if name in sys.modules))
"""
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


def test_the_option_list_is_the_configs_own():
    """The generated list holds every trainer's options as the full parser builds them, at the installed versions,
    and the registered rewards; at other versions its options are not used (the full parser checks, later)."""
    from riskpo_trl.scripts import known_options, known_options_build, known_options_data

    versions, options, rewards, layout, help_all = known_options_build.generate()
    assert rewards == known_options_data.REWARDS  # what the short --help lists
    if versions != known_options_data.VERSIONS:
        assert known_options.light_parser("riskpo", object) is None
        pytest.skip(f"the list is for {known_options_data.VERSIONS}; installed: {versions}")
    assert (
        known_options_build.render(versions, options, rewards, layout, help_all)
        == known_options_build.DATA_FILE.read_text()
    ), "stale: run python -m riskpo_trl.scripts.known_options_build"


@pytest.mark.parametrize(
    ("recipe_line", "argv", "message"),
    [
        ("", ["--bundel_size", "2"], "--bundel_size (did you mean bundle_size?)"),
        ("risk_alfa: 0.1", [], "risk_alfa (did you mean risk_alpha?)"),
        ("", ["--max_steps", "six"], "argument --max_steps/--max-steps: invalid int value: 'six'"),
        ("", ["--lr_scheduler_type", "cosin"], "invalid choice: 'cosin' (choose from 'linear', 'cosine',"),
        (
            "hub_strategy: every",
            [],
            ("hub_strategy: expected one of ['end', 'every_save', 'checkpoint', 'all_checkpoints'], got 'every'"),
        ),
        (
            "",
            ["--trainer", "grpo", "--bundle_size", "2"],
            "bundle_size (a RiskPOConfig field; trainer 'grpo' does not",
        ),
    ],
)
def test_a_mistake_is_refused_before_the_heavy_imports(tmp_path, recipe_line, argv, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.read_text().replace("trainer: riskpo", "") + recipe_line + "\n")
    result = subprocess.run(
        [sys.executable, "-c", TYPO_PROBE.format(heavy=HEAVY_MODULES), "--config", str(recipe), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    probe = result.stdout.strip().splitlines()[-1].split(" ")
    assert probe[:2] == ["PROBE", "2"], result.stderr
    lines = result.stderr.strip().splitlines()
    from riskpo_trl.scripts import known_options, known_options_data

    if known_options.installed_versions() != known_options_data.VERSIONS:
        # The list is for other TRL/transformers versions: the full parser refuses, after the imports, and those
        # libraries may print their own warnings first; ours is still one line, the last.
        assert [line for line in lines if "error:" in line] == lines[-1:], result.stderr
        assert lines[-1].startswith("riskpo-train: error:"), result.stderr
        return
    assert probe[2:] in ([], [""]), f"the check imported {probe[2:]}"
    [line] = lines
    assert line.startswith("riskpo-train: error:") and message in line, line


def test_help_all_shows_the_defaults_the_config_resolves(capsys):
    from riskpo_trl import RiskPOConfig
    from riskpo_trl.scripts import train

    with pytest.raises(SystemExit):
        train.parse_args(["--help-all"])
    printed = " ".join(capsys.readouterr().out.split())
    from riskpo_trl.risk.defaults import DEFAULT_ADVANTAGE_BASELINE

    resolved = RiskPOConfig(output_dir="unused", use_cpu=True)
    assert f"(default: {DEFAULT_ADVANTAGE_BASELINE}, resolved from None)" in printed
    assert f"(default: {resolved.steps_per_generation}, resolved from None)" in printed
    assert train.DEFAULT_ADVANTAGE_BASELINE is DEFAULT_ADVANTAGE_BASELINE  # what the short --help states


def test_the_short_help_lists_every_registered_reward(capsys):
    from riskpo_trl.scripts import train
    from riskpo_trl.tracks import REWARD_BUILDERS, REWARD_FUNCS

    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    printed = capsys.readouterr().out
    assert all(f"'{name}'" in printed for name in [*REWARD_FUNCS, *REWARD_BUILDERS])


@pytest.mark.parametrize("trainer", ["riskpo", "grpo", "gmpo"])
def test_help_all_from_the_list_is_the_full_parsers_help(capsys, monkeypatch, trainer):
    """Without a recipe --help-all is printed from the generated list, before torch loads; it must be the full
    parser's help, option for option and default for default."""
    from riskpo_trl.scripts import known_options, train

    if known_options.help_all_parser(trainer) is None:
        pytest.skip("the option list is for other TRL/transformers versions: the full parser prints it")
    monkeypatch.setenv("COLUMNS", "119")
    with pytest.raises(SystemExit):
        train.parse_args(["--help-all", "--trainer", trainer])
    from_the_list = capsys.readouterr().out
    monkeypatch.setattr(known_options, "help_all_parser", lambda trainer: None)
    with pytest.raises(SystemExit):
        train.parse_args(["--help-all", "--trainer", trainer])
    assert from_the_list == capsys.readouterr().out


def test_help_all_without_a_recipe_loads_no_heavy_library():
    from riskpo_trl.scripts.known_options import help_all_parser

    if help_all_parser("riskpo") is None:
        pytest.skip("the generated option list is for other TRL/transformers releases: --help-all loads them here")
    result = subprocess.run(
        [sys.executable, "-c", HELP_PROBE.replace('"--help"', '"--help-all"').format(heavy=HEAVY_MODULES)]
        + [CONSOLE_SCRIPTS["riskpo-train"], "riskpo-train"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    probe = result.stdout.strip().splitlines()[-1].split(" ")
    assert probe[:2] == ["PROBE", "0"] and probe[2:] in ([], [""]), result.stdout[-500:] + result.stderr[-2000:]
    assert "--advantage_baseline" in result.stdout and "(default: loo, resolved from None)" in " ".join(
        result.stdout.split()
    )
