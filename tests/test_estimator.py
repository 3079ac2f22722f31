"""RiskEstimator: one call per batch composes bundling, tracker step, quantile source and advantage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_config

from riskpo_trl import QuantileTracker, RiskEstimator, empirical_quantiles, group_quantiles
from riskpo_trl.risk import permutation_bundles, positional_bundles, riskpo_advantages

G, B = 4, 2


def binary_rewards(num_prompts: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2, (num_prompts * G,), generator=torch.Generator().manual_seed(seed)).float()


def make(**overrides) -> RiskEstimator:
    settings = dict(num_generations=G, bundle_size=B, alpha=0.2, beta=0.8, omega=0.5)
    settings.update(overrides)
    return RiskEstimator(**settings)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_training_step_is_bundling_then_tracker_update_then_advantages():
    estimator, tracker = make(), QuantileTracker([0.2, 0.8])
    for step in range(3):
        rewards = binary_rewards(6, step)
        batch = estimator.step(rewards, generator=seeded(step), train=True)
        bundles = permutation_bundles(rewards, G, B, seeded(step))
        q_alpha, q_beta = tracker.update(bundles[0]).tolist()
        expected = riskpo_advantages(
            rewards, num_generations=G, bundle_size=B, q_alpha=q_alpha, q_beta=q_beta, omega=0.5, bundles=bundles
        )
        assert torch.equal(batch.bundle_ids, expected.bundle_ids)
        assert torch.equal(batch.advantages, expected.advantages)
        assert (batch.q_alpha, batch.q_beta) == (q_alpha, q_beta)
    assert torch.equal(estimator.tracker.values, tracker.values) and estimator.tracker.num_updates == 3


def test_evaluation_never_moves_the_trackers_and_may_end_in_a_partial_group():
    estimator = make()
    rewards = binary_rewards(3, 0)  # 3 prompts: one full group of 2 and a partial one
    with pytest.raises(ValueError, match="not a multiple of bundle_size"):
        estimator.step(rewards, generator=seeded(0), train=True)
    # before any training batch: the evaluation batch's own quantiles
    batch = estimator.step(rewards, generator=seeded(0), train=False)
    assert not estimator.tracker.initialized
    expected = empirical_quantiles(batch.bundle_scores, [0.2, 0.8]).tolist()
    assert [batch.q_alpha, batch.q_beta] == pytest.approx(expected)

    estimator.step(binary_rewards(4, 1), generator=seeded(1), train=True)
    before = estimator.state_dict()
    batch = estimator.step(rewards, generator=seeded(2), train=False)
    assert estimator.state_dict() == before
    assert [batch.q_alpha, batch.q_beta] == before["quantile_tracker"]["values"]


def test_evaluation_batches_may_have_their_own_num_generations():
    estimator = make()
    rewards = binary_rewards(2, 0)[: 2 * 3]  # 2 prompts x 3 completions
    batch = estimator.step(rewards, generator=seeded(0), train=False, num_generations=3)
    assert batch.bundle_scores.numel() == 3 and batch.advantages.numel() == 6


def test_quantile_sources():
    rewards = binary_rewards(8, 3)
    group = make(quantile_source="group").step(rewards, generator=seeded(0), train=True)
    q = group_quantiles(group.bundle_scores, G, [0.2, 0.8])
    assert torch.equal(group.q_alpha, q[:, 0]) and torch.equal(group.q_beta, q[:, 1])

    estimator = make(quantile_source="batch")
    estimator.step(binary_rewards(8, 4), generator=seeded(1), train=True)  # the tracker runs but is not used
    batch = estimator.step(rewards, generator=seeded(0), train=True)
    expected = empirical_quantiles(batch.bundle_scores, [0.2, 0.8]).tolist()
    assert [batch.q_alpha, batch.q_beta] == pytest.approx(expected)
    metrics = estimator.metrics(batch)
    assert metrics["risk/tracked_q_alpha"] == pytest.approx(estimator.tracker.values[0].item())
    assert "risk/tracked_q_alpha" not in make().metrics(make().step(rewards, generator=seeded(0), train=True))


def test_positional_bundling_and_the_authors_switches_reach_the_advantage():
    rewards = binary_rewards(4, 5)
    estimator = make(
        bundling="positional",
        quantile_source="group",
        advantage_scaling="authors_code",
        omega=1.5,
        natural_baseline=False,
        credit_assignment="sum_mean",
    )
    batch = estimator.step(rewards, generator=None, train=True)
    bundles = positional_bundles(rewards, G, B)
    assert torch.equal(batch.bundle_ids, bundles[1])
    q = group_quantiles(bundles[0], G, [0.2, 0.8])
    expected = riskpo_advantages(
        rewards,
        num_generations=G,
        bundle_size=B,
        q_alpha=q[:, 0],
        q_beta=q[:, 1],
        omega=1.5,
        bundles=bundles,
        advantage_scaling="authors_code",
        levels=(0.2, 0.8),
        natural_baseline=False,
        credit_assignment="sum_mean",
    )
    assert torch.equal(batch.advantages, expected.advantages)


def test_state_round_trip_keeps_the_checkpoint_format():
    estimator = make()
    for seed in range(3):
        estimator.step(binary_rewards(4, seed), generator=seeded(seed), train=True)
    state = json.loads(json.dumps(estimator.state_dict()))  # what riskpo_state.json holds
    assert set(state) == {"quantile_tracker"}
    assert set(state["quantile_tracker"]) == {"levels", "values", "num_updates", "score_range", "lr", "lr_decay"}
    restored, from_older_release = make(), make()
    restored.load_state_dict(state)
    older = {key: value for key, value in state["quantile_tracker"].items() if key != "score_range"}
    from_older_release.load_state_dict({"quantile_tracker": older})  # saved before score_range was recorded
    rewards = binary_rewards(4, 9)
    expected = estimator.step(rewards, generator=seeded(9), train=True).advantages
    assert torch.equal(restored.step(rewards, generator=seeded(9), train=True).advantages, expected)
    assert torch.equal(from_older_release.step(rewards, generator=seeded(9), train=True).advantages, expected)


def test_from_config_reads_riskpo_fields_and_defaults_the_opt_ins(tmp_path):
    estimator = RiskEstimator.from_config(tiny_config(tmp_path, run=False, advantage_baseline="loo"))
    assert estimator.choices.advantage_baseline == "loo"
    config = tiny_config(
        tmp_path,
        run=False,
        credit_assignment="std",
        bundling="positional",
        risk_omega=1.0,
        advantage_scaling="authors_code",
        quantile_source="group",
    )
    estimator = RiskEstimator.from_config(config)
    assert (estimator.choices.credit_assignment, estimator.choices.bundling, estimator.omega) == (
        "std",
        "positional",
        1.0,
    )
    assert estimator.num_generations == 10 and estimator.bundle_size == 5
    # Duck-typed: an object without the opt-in fields gets RiskPOConfig's defaults (the paper's, and the default
    # baseline).
    older = SimpleNamespace(
        num_generations=G,
        bundle_size=B,
        risk_alpha=0.1,
        risk_beta=0.9,
        risk_omega=0.5,
        risk_profile="mvar",
        quantile_source="tracked",
        quantile_lr=0.1,
        quantile_lr_decay=0.0,
    )
    estimator = RiskEstimator.from_config(older)
    assert (
        estimator.choices.advantage_scaling,
        estimator.choices.natural_baseline,
        estimator.choices.credit_assignment,
        estimator.choices.bundling,
        estimator.choices.advantage_baseline,
    ) == ("none", True, "uniform", "permutation", "loo")
    assert estimator.tracker.levels.tolist() == [0.1, 0.9]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"quantile_source": "oracle"}, "quantile_source='oracle' is unknown"),
        ({"credit_assignment": "sum-mean"}, "credit_assignment='sum-mean' is unknown"),
        ({"bundling": "random"}, "bundling='random' is unknown"),
        ({"advantage_baseline": "lo"}, "advantage_baseline='lo' is unknown \\(did you mean loo\\?\\)"),
        (
            {"advantage_baseline": "loo", "advantage_scaling": "authors_code", "quantile_source": "group"},
            "advantage_baseline='loo' with advantage_scaling='authors_code'",
        ),
        ({"risk_profile": "rvar", "advantage_scaling": "authors_code"}, "not 'rvar'"),
    ],
)
def test_bad_choices_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        make(**overrides)
