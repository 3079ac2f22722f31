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


def ruff_pin() -> str:
    (pin,) = re.findall(r'"ruff==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    return pin


def test_the_pre_commit_hooks_run_make_qualitys_ruff_at_the_pinned_version():
    import yaml

    (repo,) = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
    hooks = repo["hooks"]
    assert {tuple(hook["additional_dependencies"]) for hook in hooks} == {(f"ruff=={ruff_pin()}",)}
    commands = [hook["entry"].replace(" --force-exclude", "") + " ." for hook in hooks]
    assert commands == make_target("quality")


def workflow() -> dict:
    import yaml

    return yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())


def ci_stages(job: dict) -> list[str]:
    """The .ci/run stages a job's steps run (a matrix's stages where the command names one)."""
    stages = []
    for step in job["steps"]:
        match = re.search(r"bash \.ci/run (\S+)", step.get("run", ""))
        if match:
            stages += job["strategy"]["matrix"]["stage"] if match.group(1) == '"$STAGE"' else [match.group(1)]
    return stages


def test_the_hosted_workflow_runs_every_ci_stage_the_fast_ones_on_each_pull_request():
    flow = workflow()
    triggers = flow[True]  # YAML 1.1 reads the key `on` as True
    assert {"pull_request", "schedule", "workflow_dispatch"} <= set(triggers)
    on_pull_requests = [job for job in flow["jobs"].values() if "if" not in job]
    scheduled = [job for job in flow["jobs"].values() if "if" in job]
    assert sorted(stage for job in on_pull_requests for stage in ci_stages(job)) == ["fast", "quality"]
    assert all("schedule" in job["if"] and "workflow_dispatch" in job["if"] for job in scheduled)
    every_stage = re.search(r"STAGES=\(([a-z_ ]+)\)", (ROOT / ".ci" / "run").read_text()).group(1).split()
    assert sorted(stage for job in flow["jobs"].values() for stage in ci_stages(job)) == sorted(every_stage)
    assert flow["permissions"] == {}  # each job asks for what it reads


def test_ci_lints_the_workflows_with_a_pinned_zizmor_in_the_quality_stage():
    run = (ROOT / ".ci" / "run").read_text()
    body = run.split("\nquality() {", 1)[1].split("\n}", 1)[0]
    assert re.search(r"^ZIZMOR_VERSION=[0-9]+\.[0-9]+\.[0-9]+$", run, re.MULTILINE)
    assert '"zizmor==$ZIZMOR_VERSION"' in body and '"$WORK/ruff/bin/zizmor" --offline' in body
    assert ".github/workflows" in body
