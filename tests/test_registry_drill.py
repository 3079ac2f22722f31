"""The drill of docs/architecture.md, the one test of it, in a copy of the package: a new risk profile (with a
hyperparameter of its own) is one edit of risk/advantages.py, a new advantage baseline one edit of risk/baselines.py
and a new quantile source one edit of risk/quantiles.py. With a test file, each then passes the contracts every
registered entry passes, the config and the command line take it by name (and its help lists it), a misspelling gets
"did you mean", the advantage step computes it, the trainer's metrics log the profile's objective and the model card
words the baseline. (A new executor: tests/test_sandbox_executors.py, in the sandbox's layer.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NEW_PROFILE = """

def exponential_objective(scores, q_alpha, q_beta, omega, eta):
    return (-torch.exp(-eta * scores[torch.isfinite(scores)]) / eta).mean()


@register_risk_profile(
    "exponential",
    objective=exponential_objective,
    help="the exponential utility E[-exp(-eta R) / eta]",
    parameters={"eta": ProfileParameter(1.0, "the risk aversion", lambda value: value > 0, "> 0")},
)
def exponential_advantage(scores, q_alpha, q_beta, omega, eta):
    return -torch.exp(-eta * scores) / eta
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

NEW_QUANTILE_SOURCE = """

@QUANTILE_SOURCES.register("extremes", help="the batch's lowest and highest bundle score")
def extreme_quantiles(bundle_scores, num_generations, levels, tracker):
    finite = bundle_scores[torch.isfinite(bundle_scores)]
    return finite.min().item(), finite.max().item()
"""

DRILL_TEST = """
import pytest
import torch
from helpers import tiny_config

from riskpo_trl import ADVANTAGE_BASELINES, RISK_PROFILES, RiskEstimator
from riskpo_trl.risk import permutation_bundles
from riskpo_trl.risk.contracts import EXPECTED_GRADIENT_TOLERANCE, baseline_contract_violations, expected_gradient_gap
from riskpo_trl.scripts import train
from riskpo_trl.job.model_card import baseline_clause

REWARDS = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0] * 8)  # 8 prompts of 5 completions


def test_the_new_entries_keep_the_contracts():
    assert expected_gradient_gap(RISK_PROFILES["exponential"]) < EXPECTED_GRADIENT_TOLERANCE
    about = ADVANTAGE_BASELINES.about("first_other")
    assert baseline_contract_violations(ADVANTAGE_BASELINES["first_other"], about) == []


def test_the_config_and_the_advantage_step_take_them_by_name(tmp_path):
    config = tiny_config(
        tmp_path,
        num_generations=5,
        per_device_train_batch_size=40,
        bundle_size=2,
        risk_profile="exponential",
        risk_profile_parameters={"eta": 2.0},
        quantile_source="extremes",
        advantage_baseline="first_other",
    )
    estimator = RiskEstimator.from_config(config)
    batch = estimator.step(REWARDS, generator=torch.Generator().manual_seed(0), train=True)
    bundles = permutation_bundles(REWARDS, 5, 2, torch.Generator().manual_seed(0))
    assert (batch.q_alpha, batch.q_beta) == (bundles[0].min().item(), bundles[0].max().item())
    bundle_advantages = (-torch.exp(-2.0 * bundles[0].double()) / 2.0)[bundles[1]]
    rows = bundle_advantages.view(-1, 5)
    assert torch.allclose(batch.advantages.double(), (rows - rows.roll(-1, dims=1)).reshape(-1), atol=1e-6)
    metrics = estimator.metrics(batch)
    assert "risk/exponential" in metrics and "risk/mvar" not in metrics and "risk/tracked_q_alpha" in metrics
    assert "a next-completion baseline" in baseline_clause(config)
    for field, typo, name in [
        ("risk_profile", "exponentail", "exponential"),
        ("quantile_source", "extreme", "extremes"),
        ("advantage_baseline", "first_othre", "first_other"),
    ]:
        with pytest.raises(ValueError, match=f"{field}='{typo}' is unknown \\\\(did you mean {name}\\\\?\\\\)"):
            tiny_config(tmp_path, **{field: typo})


def test_the_command_line_takes_and_lists_them(tmp_path, capsys):
    argv = ["--risk_profile", "exponential", "--risk_profile_parameters", '{"eta": 2.0}', "--quantile_source"]
    argv += ["extremes", "--advantage_baseline", "first_other", "--output_dir", str(tmp_path), "--use_cpu", "true"]
    _, args, _ = train.parse_args(argv)
    assert (args.risk_profile, args.quantile_source, args.advantage_baseline) == ("exponential", "extremes", "first_other")
    assert args.risk_profile_parameters == {"eta": 2.0}
    with pytest.raises(SystemExit):
        train.parse_args(["--help-all"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "'extremes' (the batch's lowest and highest bundle score)" in shown and "'exponential'" in shown
"""

EDITS = {
    Path("risk/advantages.py"): NEW_PROFILE,
    Path("risk/baselines.py"): NEW_BASELINE,
    Path("risk/quantiles.py"): NEW_QUANTILE_SOURCE,
}


def test_a_new_profile_baseline_and_quantile_source_are_one_file_each_and_a_test(tmp_path):
    copy = tmp_path / "riskpo_trl"
    shutil.copytree(ROOT / "riskpo_trl", copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path, addition in EDITS.items():
        with open(copy / path, "a") as source:
            source.write(addition)
    (tmp_path / "test_drill.py").write_text(DRILL_TEST)
    changed = sorted(
        path.relative_to(copy)
        for path in copy.rglob("*.py")
        if path.read_bytes() != (ROOT / "riskpo_trl" / path.relative_to(copy)).read_bytes()
    )
    assert changed == sorted(EDITS)
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
    assert "3 passed" in done.stdout
