"""The quality gate: `make quality` and CI's quality stage run the same ruff commands, CI runs it first, and the
configured rules catch the faults they were chosen for."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_target(name: str) -> list[str]:
    """The commands of a Makefile target, with $(RUFF) read as ruff."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index(f"{name}:") + 1
    commands = []
    for line in lines[start:]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip().replace("$(RUFF)", "ruff"))
    return commands


def test_ci_runs_make_qualitys_commands_first():
    run = (ROOT / ".ci" / "run").read_text()
    body = run.split("\nquality() {", 1)[1].split("\n}", 1)[0]
    ci_commands = [
        line.strip().removeprefix('"$WORK/ruff/bin/ruff"').split(" || ")[0].strip()
        for line in body.splitlines()
        if line.strip().startswith('"$WORK/ruff/bin/ruff"')
    ]
    assert (
        ["ruff " + command for command in ci_commands]
        == make_target("quality")
        == ["ruff check .", "ruff format --check ."]
    )
    assert re.search(r"STAGES=\(quality fast slow vllm_real compat\)", run)
    assert make_target("style") == ["ruff check --fix .", "ruff format ."]


def test_the_dev_extra_pins_the_ruff_ci_installs():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert len(re.findall(r'"ruff==[0-9.]+"', pyproject)) == 1


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the dev extra")
@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("import os\n", "F401"),  # an unused import
        ("fns = []\nfor i in range(3):\n    fns.append(lambda: i)\n", "B023"),  # a loop variable bound late
        ("def f(x=[]):\n    return x\n", "B006"),  # a mutable default
        ("x = 1\nif x == None:\n    pass\n", "E711"),
    ],
)
def test_the_configured_rules_catch_what_they_were_chosen_for(source, rule):
    done = subprocess.run(
        [
            "ruff",
            "check",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--output-format",
            "concise",
            "--stdin-filename",
            "riskpo_trl/example.py",
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1 and rule in done.stdout, done.stdout + done.stderr
