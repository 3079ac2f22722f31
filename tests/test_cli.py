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
    "riskpo-train": ["--config", "--trainer", "--dataset_name", "--reward_funcs", "--help-all"],
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
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    probe = result.stdout.strip().splitlines()[-1].split(" ")
    assert probe[:2] == ["PROBE", "0"], result.stdout
    assert probe[2:] in ([], [""]), f"--help imported {probe[2:]}"
    for option in EXPECTED_OPTIONS[name]:
        assert option in result.stdout, option


@pytest.mark.parametrize(("trainer", "listed", "absent"), [("riskpo", "--bundle_size", None),
                                                           ("grpo", "--loss_type", "--bundle_size")])
def test_train_help_all_lists_the_chosen_trainers_config_fields(capsys, trainer, listed, absent):
    from riskpo_trl.scripts import train

    with pytest.raises(SystemExit) as exit:
        train.parse_args(["--help-all", "--trainer", trainer])
    assert exit.value.code == 0
    printed = capsys.readouterr().out
    assert listed in printed and "--model_name_or_path" in printed
    assert absent is None or absent not in printed
