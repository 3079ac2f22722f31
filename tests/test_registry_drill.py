"""The drill of docs/architecture.md, in a copy of the package: a new risk profile is one edit of
risk/advantages.py and a new advantage baseline one edit of risk/baselines.py; with a test each, the config takes
them by name, the model card words the baseline, and both pass the contracts every registered entry passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NEW_PROFILE = """

def mean_objective(scores, q_alpha, q_beta, omega):
    return scores[torch.isfinite(scores)].mean()


@register_risk_profile("mean", objective=mean_objective, help="the bundle score's mean")
def mean_advantage(scores, q_alpha, q_beta, omega):
    return scores - scores[torch.isfinite(scores)].mean()
"""

NEW_BASELINE = """

@ADVANTAGE_BASELINES.register(
    "first_other",
    help="per prompt, subtract the advantage of the next completion of the prompt",
    card="a next-completion baseline",
    centred=True,
    uses_own_reward=False,
)
def next_completion_baseline(advantages, scorable, num_generations):
    rows = advantages.view(-1, num_generations)
    return (rows - rows.roll(-1, dims=1)).reshape(-1)
"""

DRILL_TEST = """
import torch
from riskpo_trl import ADVANTAGE_BASELINES, RISK_PROFILES, RiskPOConfig
from riskpo_trl.risk.contracts import baseline_contract_violations, expected_gradient_gap
from riskpo_trl.trainer.model_card import baseline_clause


def test_the_new_profile_and_baseline_pass_the_contracts(tmp_path):
    assert expected_gradient_gap(RISK_PROFILES["mean"]) < 1e-4
    about = ADVANTAGE_BASELINES.about("first_other")
    assert baseline_contract_violations(ADVANTAGE_BASELINES["first_other"], about) == []
    config = RiskPOConfig(output_dir=str(tmp_path), risk_profile="mean", advantage_baseline="first_other")
    assert "a next-completion baseline" in baseline_clause(config)
"""


def test_a_new_profile_and_a_new_baseline_are_one_file_each_and_a_test(tmp_path):
    copy = tmp_path / "riskpo_trl"
    shutil.copytree(ROOT / "riskpo_trl", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "risk" / "advantages.py", "a") as advantages:
        advantages.write(NEW_PROFILE)
    with open(copy / "risk" / "baselines.py", "a") as baselines:
        baselines.write(NEW_BASELINE)
    (tmp_path / "test_drill.py").write_text(DRILL_TEST)
    changed = sorted(
        str(path.relative_to(copy))
        for path in copy.rglob("*.py")
        if path.read_bytes() != (ROOT / "riskpo_trl" / path.relative_to(copy)).read_bytes()
    )
    assert changed == ["risk/advantages.py", "risk/baselines.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
        + ["-c", str(ROOT / "pyproject.toml"), str(tmp_path / "test_drill.py")],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
