"""Advantage baselines: the leave-one-out formula, its handling of unscorable completions, its composition with every
other choice, the refused pairing, and the gradient identity that justifies it (the mean gradient is unchanged)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from helpers import tiny_config

from riskpo_trl import ADVANTAGE_BASELINES, RiskEstimator, leave_one_out_baseline, riskpo_advantages
from riskpo_trl.risk import (
    BUNDLINGS,
    DEFAULT_ADVANTAGE_BASELINE,
    QUANTILE_SOURCES,
    RISK_PROFILES,
    mvar_advantage,
    positional_bundles,
)
from riskpo_trl.risk.contracts import baseline_contract_violations
from riskpo_trl.risk.defaults import resolve_advantage_baseline

NAN = float("nan")


def loo_by_hand(advantages: list[list[float]], scorable: list[list[bool]]) -> list[list[float]]:
    """The formula, one completion at a time: minus the mean over the prompt's other scorable completions."""
    out = []
    for row, ok in zip(advantages, scorable):
        new = []
        for j, (a, keep) in enumerate(zip(row, ok)):
            others = [row[k] for k in range(len(row)) if k != j and ok[k]]
            new.append(a - sum(others) / len(others) if keep and others else 0.0)
        out.append(new)
    return out


def test_leave_one_out_formula_on_a_hand_built_batch():
    advantages = [[-1.0, 0.0, -0.5, -0.25], [-0.3, -0.3, -0.3, -0.3], [0.0, -2.0, -1.0, 0.5]]
    scorable = [[True] * 4, [True] * 4, [True, False, True, True]]
    got = leave_one_out_baseline(
        torch.tensor(advantages, dtype=torch.float64).reshape(-1), torch.tensor(scorable).reshape(-1), 4
    ).view(3, 4)
    assert torch.allclose(got, torch.tensor(loo_by_hand(advantages, scorable), dtype=torch.float64), atol=1e-12)
    # Written out for the first prompt: -1 - (0 - 0.5 - 0.25) / 3 = -0.75, 0 - (-1.75 / 3), ...
    assert got[0].tolist() == pytest.approx([-0.75, 7 / 12, -1 / 12, 0.25])
    assert got[1].tolist() == [0.0] * 4  # equal advantages: nothing left to push
    assert got[2].tolist() == pytest.approx([0.25, 0.0, -1.25, 1.0])  # the unscorable one: 0, out of the mean


def test_the_default_is_loo_and_none_is_the_papers_advantage_bit_for_bit(tmp_path):
    rewards = torch.randint(0, 2, (40,), generator=torch.Generator().manual_seed(0)).float()
    rewards[3] = NAN
    common = dict(num_generations=4, bundle_size=2, q_alpha=0.5, q_beta=1.5, omega=0.5)
    default, loo, paper = (
        riskpo_advantages(rewards, generator=torch.Generator().manual_seed(1), **common, **named)
        for named in ({}, {"advantage_baseline": "loo"}, {"advantage_baseline": "none"})
    )
    assert torch.equal(default.advantages, loo.advantages)
    assert torch.equal(default.bundle_ids, paper.bundle_ids)
    # "none": each completion gets its bundle's MVaR advantage (the paper's eq.), never positive.
    by_bundle = mvar_advantage(paper.bundle_scores, 0.5, 1.5, 0.5)
    scorable = ~torch.isnan(rewards)
    assert torch.equal(paper.advantages[scorable], by_bundle[paper.bundle_ids][scorable].to(paper.advantages.dtype))
    assert (paper.advantages <= 0).all() and (loo.advantages > 0).any()
    assert torch.allclose(loo.advantages.double(), leave_one_out_baseline(paper.advantages.double(), scorable, 4))
    settings = dict(num_generations=4, bundle_size=2, alpha=0.2, beta=0.8, omega=0.5)
    assert RiskEstimator(**settings).choices.advantage_baseline == DEFAULT_ADVANTAGE_BASELINE == "loo"
    unset = tiny_config(tmp_path, run=False)
    assert unset.advantage_baseline is None  # the config keeps what was set; the risk layer resolves it
    assert resolve_advantage_baseline(unset.advantage_baseline, unset.advantage_scaling) == "loo"
    assert RiskEstimator.from_config(unset).choices.advantage_baseline == "loo"
    assert tiny_config(tmp_path, run=False, advantage_baseline="none").advantage_baseline == "none"


def test_unscorable_completions_and_prompts_with_one_scorable_completion():
    G = 4
    rewards = torch.tensor(
        [
            1,
            NAN,
            0,
            0,  # one unscorable: left out of the mean
            NAN,
            NAN,
            1,
            NAN,  # one scorable: nothing to compare with, 0
            NAN,
            NAN,
            NAN,
            NAN,  # none scorable
            0,
            0,
            1,
            1,
        ],
        dtype=torch.float32,
    )
    bundles = positional_bundles(rewards, G, 2)
    paper = riskpo_advantages(
        rewards, num_generations=G, q_alpha=0.5, q_beta=1.5, omega=0.5, bundles=bundles, advantage_baseline="none"
    )
    loo = riskpo_advantages(
        rewards, num_generations=G, q_alpha=0.5, q_beta=1.5, omega=0.5, bundles=bundles, advantage_baseline="loo"
    )
    scorable = ~torch.isnan(rewards)
    expected = loo_by_hand(paper.advantages.double().view(-1, G).tolist(), scorable.view(-1, G).tolist())
    assert torch.allclose(loo.advantages.view(-1, G).double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert (loo.advantages[~scorable] == 0).all()
    assert (loo.advantages[4:12] == 0).all()
    assert not torch.isnan(loo.advantages).any()
    assert loo.advantages.view(-1, G).sum(1).tolist() == pytest.approx([0.0] * 4, abs=1e-6)


COMBINATIONS = [
    pytest.param(profile, source, bundling, B, id=f"{profile}-{source}-{bundling}-B{B}")
    for profile, source, bundling, B in itertools.product(RISK_PROFILES, QUANTILE_SOURCES, BUNDLINGS, (1, 2, 5))
]


@pytest.mark.parametrize(("profile", "source", "bundling", "B"), COMBINATIONS)
def test_loo_composes_with_every_profile_quantile_source_bundling_and_bundle_size(profile, source, bundling, B):
    """Same batch, same draws: "loo" is exactly the paper's advantages centred per prompt, summing to 0 per prompt,
    two-signed whenever a prompt's paper advantages differ."""
    G, prompts = 5, 10
    settings = dict(
        num_generations=G,
        bundle_size=B,
        alpha=0.2,
        beta=0.8,
        omega=0.5,
        risk_profile=profile,
        quantile_source=source,
        bundling=bundling,
    )
    paper, loo = (
        RiskEstimator(**settings, advantage_baseline="none"),
        RiskEstimator(**settings, advantage_baseline="loo"),
    )
    for step in range(3):
        rewards = torch.randint(0, 2, (prompts * G,), generator=torch.Generator().manual_seed(step)).float()
        rewards[7] = NAN
        a = paper.step(rewards, generator=torch.Generator().manual_seed(100 + step), train=True)
        b = loo.step(rewards, generator=torch.Generator().manual_seed(100 + step), train=True)
        assert torch.equal(a.bundle_ids, b.bundle_ids)
        expected = leave_one_out_baseline(a.advantages.double(), ~torch.isnan(rewards), G)
        assert torch.allclose(b.advantages.double(), expected, atol=1e-6)
        assert b.advantages.double().view(-1, G).sum(1).abs().max() < 1e-5
        rows = b.advantages.view(-1, G)
        rows = rows[rows.abs().max(1).values > 1e-6]  # prompts whose scorable paper advantages differ
        assert ((rows > 0).any(1) & (rows < 0).any(1)).all()
    assert torch.equal(paper.tracker.values, loo.tracker.values)  # the baseline never touches the trackers


def test_loo_makes_the_natural_baseline_constant_irrelevant():
    rewards = torch.randint(0, 2, (40,), generator=torch.Generator().manual_seed(8)).float()
    kept, dropped = (
        riskpo_advantages(
            rewards,
            num_generations=4,
            bundle_size=2,
            q_alpha=0.5,
            q_beta=1.5,
            omega=0.5,
            generator=torch.Generator().manual_seed(9),
            natural_baseline=natural,
            advantage_baseline="loo",
        ).advantages
        for natural in (True, False)
    )
    assert torch.allclose(kept, dropped, atol=1e-6)


def test_loo_with_score_credit_and_evaluation_batches():
    """Per-member credit keeps the baseline free of the completion itself, so the pair is allowed; an evaluation
    batch (partial last group, its own G) is centred per prompt too."""
    estimator = RiskEstimator(
        num_generations=4,
        bundle_size=2,
        alpha=0.2,
        beta=0.8,
        omega=0.5,
        credit_assignment="score",
        advantage_baseline="loo",
    )
    rewards = torch.randint(0, 2, (5 * 6,), generator=torch.Generator().manual_seed(3)).float()
    batch = estimator.step(rewards, generator=torch.Generator().manual_seed(4), train=False, num_generations=6)
    assert batch.advantages.view(-1, 6).sum(1).abs().max() < 1e-5


def test_the_authors_scaling_refuses_a_baseline_at_config_time(tmp_path):
    message = "advantage_baseline='loo' with advantage_scaling='authors_code'"
    with pytest.raises(ValueError, match=message):
        tiny_config(
            tmp_path,
            run=False,
            advantage_baseline="loo",
            advantage_scaling="authors_code",
            quantile_source="group",
            credit_assignment="std",
        )
    with pytest.raises(ValueError, match=message):
        RiskEstimator(
            num_generations=4,
            bundle_size=2,
            alpha=0.2,
            beta=0.8,
            omega=1.5,
            advantage_baseline="loo",
            advantage_scaling="authors_code",
            quantile_source="group",
        )
    with pytest.raises(ValueError, match="advantage_baseline='mean' is unknown"):
        tiny_config(tmp_path, run=False, advantage_baseline="mean")
    assert list(ADVANTAGE_BASELINES) == ["none", "loo"]


def test_the_authors_scaling_alone_resolves_the_default_to_none(tmp_path, caplog):
    """The default "loo" is refused with the authors' scaling, so choosing that scaling without naming a baseline
    gets their code's "none" (a warning, once); naming "loo" with it stays an error (above)."""
    authors = dict(advantage_scaling="authors_code", quantile_source="group", credit_assignment="std")
    with caplog.at_level("WARNING", logger="riskpo_trl.risk.defaults"):
        config = tiny_config(tmp_path, run=False, **authors)
    assert config.advantage_baseline is None
    assert resolve_advantage_baseline(config.advantage_baseline, config.advantage_scaling) == "none"
    [record] = [r for r in caplog.records if "advantage_baseline not set" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert "advantage_baseline not set with advantage_scaling='authors_code': using 'none'" in record.getMessage()
    estimator = RiskEstimator.from_config(config)
    assert estimator.choices.advantage_baseline == "none"
    direct = RiskEstimator(num_generations=4, bundle_size=2, alpha=0.2, beta=0.8, omega=1.5, **authors)
    assert direct.choices.advantage_baseline == "none"
    assert tiny_config(tmp_path, run=False, advantage_baseline="none", **authors).advantage_baseline == "none"


def test_logged_push_shares_show_the_two_signs(tmp_path):
    rewards = torch.randint(0, 2, (40,), generator=torch.Generator().manual_seed(5)).float()
    common = dict(num_generations=4, bundle_size=2, q_alpha=0.5, q_beta=1.5, omega=0.5)
    paper = riskpo_advantages(
        rewards, generator=torch.Generator().manual_seed(6), advantage_baseline="none", **common
    ).metrics(0.5)
    loo = riskpo_advantages(
        rewards, generator=torch.Generator().manual_seed(6), advantage_baseline="loo", **common
    ).metrics(0.5)
    assert paper["risk/frac_positive_advantage"] == 0.0 and paper["risk/frac_negative_advantage"] > 0
    assert loo["risk/frac_positive_advantage"] > 0 and loo["risk/frac_negative_advantage"] > 0


# --- the gradient identity ------------------------------------------------------------------------------------------


def _mean_gradients(baseline, *, batches: int, seed: int) -> torch.Tensor:
    """Per batch, the score-function gradient ``mean_ij A_ij * grad log pi_i(y_ij)`` of a softmax policy over ``V``
    answers per prompt (``grad log pi_i(y) = e_y - pi_i``), with RiskPO's bundled MVaR advantage at fixed quantiles;
    ``baseline`` post-processes the batch's advantages. Returns the (batches, P * V) per-batch gradients."""
    P, G, B, V = 4, 6, 2, 3
    generator = torch.Generator().manual_seed(seed)
    logits = torch.tensor([[0.5, 0.0, -0.5], [-1.0, 0.3, 0.2], [0.0, 0.0, 0.0], [1.0, -1.0, 0.0]], dtype=torch.float64)
    policy = logits.softmax(-1)
    reward_of = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = torch.empty(batches, P * V, dtype=torch.float64)
    for n in range(batches):
        answers = torch.multinomial(policy, G, replacement=True, generator=generator)  # (P, G)
        rewards = reward_of.gather(1, answers).reshape(-1)
        batch = riskpo_advantages(
            rewards,
            num_generations=G,
            bundle_size=B,
            q_alpha=0.5,
            q_beta=1.5,
            omega=0.5,
            generator=generator,
            advantage_baseline="none",
        )
        advantages = baseline(batch.advantages.double(), torch.ones_like(rewards, dtype=torch.bool), G).view(P, G)
        score = torch.nn.functional.one_hot(answers, V).double() - policy.unsqueeze(1)  # (P, G, V)
        out[n] = (advantages.unsqueeze(-1) * score).sum(1).reshape(-1) / (P * G)
    return out


def _mean_including_self(advantages: torch.Tensor, scorable: torch.Tensor, num_generations: int) -> torch.Tensor:
    """A baseline that depends on the completion itself (its prompt's mean, the completion included): biased."""
    rows = advantages.view(-1, num_generations)
    return (rows - rows.mean(1, keepdim=True)).reshape(-1)


def test_loo_keeps_the_mean_gradient_and_the_test_detects_a_biased_baseline():
    """Monte Carlo at fixed quantiles: the mean gradient with "loo" equals the paper's within 4 standard errors of
    the paired difference in every coordinate; a baseline that includes the completion itself (which shrinks the
    gradient by (G - 1) / G) fails the same check."""
    batches = 3000
    paper = _mean_gradients(ADVANTAGE_BASELINES["none"], batches=batches, seed=0)
    loo = _mean_gradients(leave_one_out_baseline, batches=batches, seed=0)  # same draws: a paired difference
    biased = _mean_gradients(_mean_including_self, batches=batches, seed=0)

    def z_scores(a: torch.Tensor) -> torch.Tensor:
        diff = a - paper
        return diff.mean(0) / (diff.std(0) / batches**0.5)

    signal = paper.mean(0) / (paper.std(0) / batches**0.5)
    assert signal.abs().max() > 10  # the gradient itself is resolved
    assert z_scores(loo).abs().max() < 4
    assert z_scores(biased).abs().max() > 8


def test_the_authors_scaling_resolution_reaches_a_users_terminal(tmp_path):
    """Without any logging set up (a user's script), the resolution is printed on stderr."""
    script = (
        "from riskpo_trl import RiskPOConfig\n"
        f"RiskPOConfig(output_dir={str(tmp_path)!r}, use_cpu=True, advantage_scaling='authors_code', "
        "quantile_source='group', credit_assignment='std')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "advantage_baseline not set with advantage_scaling='authors_code': using 'none'" in done.stderr


def test_the_baseline_default_is_written_in_one_module():
    """The rule "unset means loo, or none with the authors' scaling" lives in risk/defaults.py; the config, the
    checkpoints, the model card, the CLI and the GRPO conversion ask it rather than restate it."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "riskpo_trl"
    writers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"^\s*(DEFAULT|PAPER)_ADVANTAGE_BASELINE\s*=", path.read_text(), re.MULTILINE)
        or "_advantage_baseline_unset" in path.read_text()
        or "def resolve_advantage_baseline" in path.read_text()
    )
    assert writers == ["risk/defaults.py"]


@pytest.mark.parametrize("name", list(ADVANTAGE_BASELINES))
def test_every_registered_baseline_keeps_the_contract_its_entry_states(name):
    assert baseline_contract_violations(ADVANTAGE_BASELINES[name], ADVANTAGE_BASELINES.about(name)) == []


def test_a_baseline_whose_mean_includes_the_completion_itself_breaks_the_contract():
    """Mutation: the prompt's plain mean (the completion included) centres the advantages but uses each completion's
    own reward, which biases the gradient; the contract test names it."""

    def mean_with_itself(advantages, scorable, num_generations):
        rows = advantages.view(-1, num_generations)
        return (rows - rows.mean(dim=1, keepdim=True)).reshape(-1)

    broken = baseline_contract_violations(mean_with_itself, {"centred": True, "uses_own_reward": False})
    assert len(broken) == 1 and "own advantage enters its baseline" in broken[0]
    not_centred = baseline_contract_violations(
        ADVANTAGE_BASELINES["none"], {"centred": True, "uses_own_reward": False}
    )
    assert len(not_centred) == 1 and "centred, but" in not_centred[0]
