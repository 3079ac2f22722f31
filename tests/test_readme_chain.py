"""The README's commands chain: its two CPU smoke runs, then its evaluation and plot commands on the outputs those runs
made, in the README's order, offline, end with a figure of both runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"riskpo-train": "riskpo_trl.scripts.train", "riskpo-eval": "riskpo_trl.scripts.eval"}
MODULES["riskpo-plot"] = "riskpo_trl.scripts.plot"


def section_commands(section: str) -> list[str]:
    """The commands of the first bash block under the README's ``## section``, continuation lines joined, up to a
    comment line that starts with "# With the Hub" (what needs a network is not run here)."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    block = block.split("# With the Hub", 1)[0].replace("\\\n", " ")
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def chain() -> list[str]:
    smoke = [command for command in section_commands("Training with recipes") if "recipes/tiny/" in command]
    return smoke[:2] + section_commands("Evaluation and figures")


def test_the_chain_is_the_smoke_runs_then_their_evaluation_and_plot():
    commands = chain()
    assert [shlex.split(command)[0] for command in commands] == [
        "riskpo-train",
        "riskpo-train",
        "riskpo-eval",
        "riskpo-eval",
        "riskpo-plot",
    ], commands
    made = {shlex.split(command)[shlex.split(command).index("--config") + 1] for command in commands[:2]}
    output_dirs = set()
    for recipe in made:
        [line] = [line for line in (ROOT / recipe).read_text().splitlines() if line.startswith("output_dir:")]
        output_dirs.add(line.split(":", 1)[1].split("#")[0].strip())
    read = " ".join(commands[2:])
    assert all(output_dir in read for output_dir in output_dirs), (output_dirs, read)


@pytest.mark.slow
def test_the_readme_commands_run_in_order_offline_and_end_with_a_plot(tmp_path):
    for name in ("recipes", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for command in chain():
        program, *arguments = shlex.split(command)
        result = subprocess.run(
            [sys.executable, "-m", MODULES[program], *arguments],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    assert (tmp_path / "eval/tiny-curves.png").is_file()
    assert (tmp_path / "eval/tiny-riskpo/results.json").is_file() and (
        tmp_path / "eval/tiny-grpo/results.json"
    ).is_file()
