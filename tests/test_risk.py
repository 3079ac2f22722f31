"""The pure risk math: bundling, advantages, the gradient identity behind them."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

import pytest
import torch

from riskpo_trl import (
    BUNDLINGS,
    RISK_PROFILES,
    authors_code_mvar_advantage,
    authors_code_risk_seeking_advantage,
    empirical_quantiles,
    group_quantiles,
    mvar_advantage,
    mvar_objective,
    permutation_bundles,
    positional_bundles,
    risk_seeking_advantage,
    riskpo_advantages,
    rvar_advantage,
    rvar_window,
)
from riskpo_trl.risk.contracts import expected_gradient_gap, normal_expectation

CHI2_CRITICAL_P001 = {5: 20.515, 35: 66.619}  # chi-square quantiles at 1 - 0.001

# The paper's advantage: no baseline (the library's default subtracts a leave-one-out one).
paper_advantages = functools.partial(riskpo_advantages, advantage_baseline="none")


def _chi2(counts: list[int], expected: float) -> float:
    return sum((c - expected) ** 2 / expected for c in counts)


def _slots(bundle_ids: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Bundle slot (0..G-1) of every completion, one row per prompt."""
    return (bundle_ids % num_generations).view(-1, num_generations)


# --- permutation bundling ------------------------------------------------------------------------------------------


def test_every_completion_in_exactly_one_bundle_with_one_member_per_prompt():
    G, B, P = 6, 3, 12
    rewards = torch.rand(P * G)
    scores, ids = permutation_bundles(rewards, G, B, torch.Generator().manual_seed(1))
    assert scores.shape == (P // B * G,)
    assert ids.shape == (P * G,)
    assert torch.bincount(ids, minlength=scores.numel()).eq(B).all()  # B members per bundle
    prompt_of = torch.arange(P * G) // G
    for bundle in range(scores.numel()):
        members = prompt_of[ids == bundle]
        group = bundle // G
        assert sorted(members.tolist()) == list(range(group * B, (group + 1) * B))  # one per prompt of its group
        assert scores[bundle] == pytest.approx(rewards[ids == bundle].sum().item(), abs=1e-6)
    # every prompt's completions are spread over all G bundles of its group: a permutation
    assert (_slots(ids, G).sort(dim=1).values == torch.arange(G)).all()


def test_a_partial_last_group_is_scored_on_the_scale_of_a_full_bundle():
    G, B = 3, 2
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # 3 prompts: one full group, one of 1 prompt
    with pytest.raises(ValueError, match="not a multiple"):
        permutation_bundles(rewards, G, B)
    scores, ids = permutation_bundles(rewards, G, B, allow_partial_group=True)
    assert scores.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]  # the lone prompt's 1s count as a 2-member bundle
    assert torch.bincount(ids).tolist() == [2, 2, 2, 1, 1, 1]


def test_bundle_size_one_is_no_bundling():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 3.0, 4.0])
    scores, ids = permutation_bundles(rewards, 3, 1, torch.Generator().manual_seed(0))
    assert torch.equal(scores[ids], rewards)


def test_permutations_are_uniform_and_independent_across_prompts():
    G, B, groups = 3, 2, 6000
    _, ids = permutation_bundles(torch.zeros(groups * B * G), G, B, torch.Generator().manual_seed(123))
    slots = [tuple(row) for row in _slots(ids, G).tolist()]
    marginal = Counter(slots)
    assert len(marginal) == math.factorial(G)
    assert _chi2(list(marginal.values()), len(slots) / 6) < CHI2_CRITICAL_P001[5]
    joint = Counter(zip(slots[0::2], slots[1::2]))  # the two prompts of each group
    assert len(joint) == 36
    assert _chi2(list(joint.values()), groups / 36) < CHI2_CRITICAL_P001[35]


def test_permutations_differ_between_steps_and_repeat_for_the_same_seed():
    rewards = torch.zeros(10 * 10)
    _, a = permutation_bundles(rewards, 10, 5, torch.Generator().manual_seed(0))
    _, b = permutation_bundles(rewards, 10, 5, torch.Generator().manual_seed(1))
    _, a_again = permutation_bundles(rewards, 10, 5, torch.Generator().manual_seed(0))
    assert not torch.equal(a, b)
    assert torch.equal(a, a_again)


@pytest.mark.parametrize(
    ("num_rewards", "G", "B", "message"),
    [(12, 5, 1, "num_generations=5"), (24, 4, 4, "not a multiple of bundle_size=4"), (8, 4, 0, "must be >= 1")],
)
def test_bad_layouts_raise(num_rewards, G, B, message):
    with pytest.raises(ValueError, match=message):
        permutation_bundles(torch.zeros(num_rewards), G, B)


def test_unscorable_completions_leave_their_bundle_scores():
    G, B = 4, 2
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0] + [float("nan")] * G)  # prompt 1 is wholly unscorable
    scores, ids = permutation_bundles(rewards, G, B, torch.Generator().manual_seed(0))
    # each bundle has one scorable member scoring 1: rescaled to a full bundle of B members
    assert torch.equal(scores, torch.full((G,), 2.0))

    rewards = torch.full((B * G,), float("nan"))
    scores, _ = permutation_bundles(rewards, G, B)
    assert torch.isnan(scores).all()
    batch = paper_advantages(rewards, num_generations=G, bundle_size=B, q_alpha=0.0, q_beta=1.0, omega=0.5)
    assert torch.equal(batch.advantages, torch.zeros(B * G))


# --- advantages -----------------------------------------------------------------------------------------------------


def test_mvar_advantage_shape_of_the_paper():
    qa, qb, omega = 1.0, 3.0, 0.5
    z = torch.linspace(-2, 6, 801, dtype=torch.float64)
    adv = mvar_advantage(z, qa, qb, omega)
    assert (adv <= 0).all()
    assert (adv[z >= qb] == 0).all()  # the upper tail is excluded
    mid = (z > qa) & (z < qb)
    assert torch.allclose(adv[mid], z[mid] - qb)  # slope 1 between the quantiles
    low = z < qa
    assert torch.allclose(adv[low], (qa - qb) - (1 + omega) * (qa - z[low]))  # slope 1 + omega below q_alpha
    # explicit formula, elementwise
    g = (z - qa).clamp(min=0) - (z - qb).clamp(min=0) + qa - qb
    assert torch.allclose(adv, -(1 + omega) * (qa - z).clamp(min=0) + g)


def test_upper_tail_advantage_is_exactly_zero_with_tracked_float_quantiles():
    # Tracked quantiles are arbitrary floats; the window's four terms must not leave rounding residue above q_beta,
    # or risk/frac_zero_advantage and the paper's "A = 0 on the upper tail" would not hold exactly.
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        qa, qb = sorted(torch.rand(2, generator=generator, dtype=torch.float64).mul(5).tolist())
        z = torch.rand(1000, generator=generator, dtype=torch.float64).mul(8) - 1
        for advantage in (mvar_advantage(z, qa, qb, 0.5), rvar_advantage(z, qa, qb)):
            assert (advantage[z >= qb] == 0).all()
        assert (risk_seeking_advantage(z, qa, qb, 0.5)[z <= qa] == 0).all()


def test_quantiles_as_tensors_and_omega_zero_is_cvar():
    z = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    a = mvar_advantage(z, torch.tensor(1.0), torch.tensor(3.0), 0.0)
    assert torch.allclose(a, -(3.0 - z).clamp(min=0))  # CVaR_beta: -(q_beta - z)^+
    assert torch.allclose(rvar_advantage(z, 1.0, 3.0), torch.tensor([-2.0, -2.0, -1.0, 0.0, 0.0]))


def test_risk_seeking_mirrors_mvar():
    z = torch.linspace(-2, 6, 81, dtype=torch.float64)
    qa, qb, omega = 1.0, 3.0, 0.5
    rs = risk_seeking_advantage(z, qa, qb, omega)
    assert (rs >= 0).all() and (rs[z <= qa] == 0).all()
    # risk-seeking on z is MVaR on -z with mirrored levels, negated
    assert torch.allclose(rs, -mvar_advantage(-z, -qb, -qa, omega))


@pytest.mark.parametrize("omega", [0.0, 0.5, 1.0])
@pytest.mark.parametrize(("alpha", "beta"), [(0.2, 0.8), (0.1, 0.9), (0.0, 0.6)])
def test_theorem1_score_function_gradient_of_known_objectives(alpha, beta, omega):
    """For a location family R = theta + noise every quantile moves one-for-one with theta, so
    d/dtheta [(1+w) a RVaR_{0:a} + (b-a) RVaR_{a:b}] = (1+w) a + (b-a), and likewise for the other profiles.
    With the true quantiles the score-function estimator E[A * grad log pi] must give exactly that."""
    theta = 0.7
    normal = torch.distributions.Normal(theta, 1.0)
    qa, qb = (
        normal.icdf(torch.tensor(level, dtype=torch.float64)).item() if level > 0 else -1e9 for level in (alpha, beta)
    )
    expected = {
        "mvar": (1 + omega) * alpha + (beta - alpha),
        "rvar": beta - alpha,
        "risk_seeking": (1 + omega) * (1 - beta) + (beta - alpha),
    }
    for profile, fn in RISK_PROFILES.items():
        got = normal_expectation(lambda x, fn=fn: fn(x, qa, qb, omega), theta)
        assert got == pytest.approx(expected[profile], abs=1e-6), profile


@pytest.mark.parametrize("name", list(RISK_PROFILES))
def test_every_registered_profile_passes_the_expected_gradient_test(name):
    """A profile's advantage is an unbiased score-function estimate of its own objective's gradient."""
    assert expected_gradient_gap(RISK_PROFILES[name]) < 1e-4


def test_an_advantage_that_is_not_its_objectives_gradient_fails_the_expected_gradient_test():
    """Mutation: MVaR's advantage without its extra weight on the lower tail (omega dropped) is RVaR's, not MVaR's."""
    from riskpo_trl.risk import RiskProfile

    class WithoutOmega(RiskProfile):
        def __call__(self, scores, q_alpha, q_beta, omega, **context):
            return super().__call__(scores, q_alpha, q_beta, 0.0, **context)

    assert expected_gradient_gap(WithoutOmega("mvar", RISK_PROFILES["mvar"].objective)) > 0.05


def test_sampled_surrogate_gradient_matches_the_objective():
    """The autograd gradient of mean(A * log pi) over samples estimates dJ/dtheta (Monte Carlo, 5 sigma)."""
    torch.manual_seed(0)
    alpha, beta, omega, n = 0.2, 0.8, 0.5, 400_000
    theta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    samples = theta.detach() + torch.randn(n, dtype=torch.float64)
    normal = torch.distributions.Normal(theta.detach(), 1.0)
    qa, qb = normal.icdf(torch.tensor([alpha, beta], dtype=torch.float64)).tolist()
    adv = mvar_advantage(samples, qa, qb, omega)
    log_prob = torch.distributions.Normal(theta, 1.0).log_prob(samples)
    (adv * log_prob).mean().backward()
    per_sample = adv * (samples - theta.detach())
    tolerance = 5 * per_sample.std().item() / math.sqrt(n)
    assert theta.grad.item() == pytest.approx((1 + omega) * alpha + (beta - alpha), abs=tolerance)


def test_riskpo_advantages_spread_bundle_values_and_are_never_nan():
    G, B = 5, 2
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1, float("nan"), 0], dtype=torch.float32)
    batch = paper_advantages(
        rewards,
        num_generations=G,
        bundle_size=B,
        q_alpha=0.5,
        q_beta=1.5,
        omega=0.5,
        generator=torch.Generator().manual_seed(3),
    )
    assert not torch.isnan(batch.advantages).any()
    assert batch.advantages[8] == 0  # the unscorable completion itself
    expected = mvar_advantage(batch.bundle_scores.double(), 0.5, 1.5, 0.5)[batch.bundle_ids].float()
    scorable = ~torch.isnan(rewards)
    assert torch.allclose(batch.advantages[scorable], expected[scorable])


def known_batch():
    """Bundle scores 0-4, two completions each, quantiles 1 and 3: the upper two scores get advantage 0."""
    return paper_advantages(
        torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]).repeat_interleave(2),
        num_generations=2,
        bundle_size=1,
        q_alpha=1.0,
        q_beta=3.0,
        omega=0.5,
    )


def test_metrics_of_a_known_batch():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    assert mvar_objective(scores, 1.0, 3.0, 0.5).item() == pytest.approx((1.5 * (0 + 1) + 2 + 3) / 5)
    batch = known_batch()
    metrics = batch.metrics(omega=0.5)
    assert metrics["risk/lower_rvar"] == pytest.approx(0.5)  # mean of the scores <= q_alpha: 0 and 1
    assert metrics["risk/bundle_score_mean"] == pytest.approx(2.0)
    assert metrics["risk/frac_zero_advantage"] == pytest.approx(0.4)  # scores 3 and 4 sit at or above q_beta


def test_an_advantage_within_rounding_of_zero_counts_as_zero_and_the_three_shares_add_up():
    # A baseline subtracted in float64 leaves residues like -8.9e-16 where the advantage is 0, with a sign that
    # differs between CPU and CUDA (the GPU check found it): the zero share must not depend on that sign.
    batch = known_batch()
    residue = torch.tensor([0.0] * 6 + [-8.9e-16, 8.9e-16, 0.0, -1e-12], dtype=batch.advantages.dtype)
    metrics = dataclasses.replace(batch, advantages=batch.advantages + residue).metrics(omega=0.5)
    assert metrics["risk/frac_zero_advantage"] == pytest.approx(0.4)
    shares = ("risk/frac_zero_advantage", "risk/frac_negative_advantage", "risk/frac_positive_advantage")
    assert sum(metrics[name] for name in shares) == pytest.approx(1.0)


def test_empirical_quantiles_ignore_nan():
    q = empirical_quantiles(torch.tensor([0.0, float("nan"), 10.0]), [0.0, 0.5, 1.0])
    assert q.tolist() == [0.0, 5.0, 10.0]
    assert torch.isnan(empirical_quantiles(torch.tensor([float("nan")]), [0.5])).all()


def test_group_quantiles_are_per_bundle_group():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 10.0, 10.0, 20.0, 20.0])  # two groups of G=4 bundles
    q = group_quantiles(scores, 4, [0.0, 1.0])
    assert q.shape == (8, 2)
    assert q[:4].tolist() == [[0.0, 3.0]] * 4 and q[4:].tolist() == [[10.0, 20.0]] * 4


def test_authors_code_scaling_is_a_convex_mix_divided_by_the_group_std():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0], dtype=torch.float64)
    qa, qb, alpha, beta, mix = 1.0, 3.0, 0.2, 0.8, 1.5
    adv = authors_code_mvar_advantage(scores, qa, qb, mix, alpha=alpha, beta=beta, num_generations=4)
    lower = -(qa - scores[:4]).clamp(min=0) / alpha
    window = ((scores[:4] - qa).clamp(min=0) - (scores[:4] - qb).clamp(min=0) + qa - qb) / (beta - alpha)
    expected = (mix * lower + window) / (1 + mix) / scores[:4].std()
    assert torch.allclose(adv[:4], expected)
    assert torch.equal(adv[4:], torch.zeros(4, dtype=torch.float64))  # constant group: unscaled, and at q_beta+ -> 0
    with pytest.raises(ValueError, match="alpha"):
        authors_code_mvar_advantage(scores, qa, qb, mix, alpha=0.0, beta=beta, num_generations=4)


# --- registries and the authors' switches ---------------------------------------------------------------------------


def test_positional_bundles_pair_completion_j_of_every_prompt():
    G, B = 3, 2
    rewards = torch.arange(4 * G, dtype=torch.float32)  # 4 prompts
    scores, ids = positional_bundles(rewards, G, B)
    assert ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]
    assert scores.tolist() == [0 + 3, 1 + 4, 2 + 5, 6 + 9, 7 + 10, 8 + 11]
    assert torch.equal(BUNDLINGS["positional"](rewards, G, B)[1], ids)
    with pytest.raises(ValueError, match="not a multiple"):
        positional_bundles(rewards[: 3 * G], G, B)


def test_every_advantage_variant_is_reachable_by_name_and_unknown_pairs_are_refused():
    z = torch.linspace(0, 5, 12, dtype=torch.float64)
    pairs = [(scaling, profile) for profile, entry in RISK_PROFILES.items() for scaling in entry.scalings]
    assert len(pairs) == 5 and ("authors_code", "mvar") in pairs
    for scaling, profile in pairs:
        variant = RISK_PROFILES[profile].scalings[scaling]
        batch = paper_advantages(
            z.repeat_interleave(2).float(),
            num_generations=4,
            bundle_size=1,
            q_alpha=1.0,
            q_beta=3.0,
            omega=0.5,
            risk_profile=profile,
            advantage_scaling=scaling,
            levels=(0.2, 0.8),
            bundling="positional",
        )
        direct = variant.fn(
            batch.bundle_scores.double(),
            1.0,
            3.0,
            0.5,
            **{
                name: value
                for name, value in dict(alpha=0.2, beta=0.8, num_generations=4, natural_baseline=True).items()
                if name in variant.wants
            },
        )
        assert torch.allclose(batch.advantages, direct[batch.bundle_ids].float()), (scaling, profile)
    with pytest.raises(ValueError, match="not 'rvar'"):
        paper_advantages(
            z,
            num_generations=4,
            bundle_size=1,
            q_alpha=1.0,
            q_beta=3.0,
            omega=0.5,
            risk_profile="rvar",
            advantage_scaling="authors_code",
            levels=(0.2, 0.8),
        )
    with pytest.raises(ValueError, match="levels"):
        paper_advantages(
            z, num_generations=4, bundle_size=1, q_alpha=1.0, q_beta=3.0, omega=0.5, advantage_scaling="authors_code"
        )
    with pytest.raises(ValueError, match="credit_assignment"):
        paper_advantages(
            z, num_generations=4, bundle_size=1, q_alpha=1.0, q_beta=3.0, omega=0.5, credit_assignment="sum-mean"
        )


def test_natural_baseline_false_drops_the_window_constant():
    z = torch.linspace(-2, 6, 81, dtype=torch.float64)
    qa, qb = 1.0, 3.0
    for fn in (mvar_advantage, rvar_advantage):
        assert torch.allclose(fn(z, qa, qb, 0.5, natural_baseline=False), fn(z, qa, qb, 0.5) - (qa - qb))
    window = rvar_window(z, qa, qb, natural_baseline=False)
    assert (window >= 0).all() and (window[z <= qa] == 0).all() and (window[z >= qb] == qb - qa).all()


def test_authors_risk_seeking_scaling():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    qa, qb, alpha, beta, u = 1.0, 3.0, 0.2, 0.8, 1.5
    adv = authors_code_risk_seeking_advantage(scores, qa, qb, u, alpha=alpha, beta=beta, num_generations=6)
    upper = (scores - qb).clamp(min=0) / (1 - beta)
    window = ((scores - qa).clamp(min=0) - (scores - qb).clamp(min=0) + qa - qb) / (beta - alpha)
    assert torch.allclose(adv, (u * upper + window) / (1 + u) / scores.std())
    with pytest.raises(ValueError, match="1 - beta"):
        authors_code_risk_seeking_advantage(scores, qa, qb, u, alpha=alpha, beta=1.0, num_generations=6)


def test_metrics_leave_out_empty_tails_and_count_unscorable_completions():
    # Binary rewards, B = 1: every score is 0 or 1 and q_beta = 1, so nothing lies above q_beta.
    rewards = torch.tensor([0.0, 1.0, 1.0, float("nan"), 1.0, 0.0, 1.0, 1.0])
    batch = paper_advantages(
        rewards,
        num_generations=4,
        bundle_size=1,
        q_alpha=0.0,
        q_beta=1.0,
        omega=0.5,
        generator=torch.Generator().manual_seed(0),
    )
    metrics = batch.metrics(omega=0.5)
    assert "risk/upper_rvar" not in metrics
    assert metrics["risk/lower_rvar"] == pytest.approx(0.0)
    assert metrics["risk/frac_unscorable"] == pytest.approx(1 / 8)
    assert all(math.isfinite(v) for k, v in metrics.items() if k != "risk/bundle_score_std")


def test_each_profile_logs_its_own_objective():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    for profile, metric_value in [
        ("mvar", (1.5 * 0 + 1.5 * 1 + 2 + 3) / 5),
        ("rvar", (2 + 3) / 5),
        ("risk_seeking", (2 + 3 + 1.5 * 4) / 5),
    ]:
        batch = paper_advantages(
            scores.float(),
            num_generations=5,
            bundle_size=1,
            q_alpha=1.0,
            q_beta=3.0,
            omega=0.5,
            risk_profile=profile,
            bundling="positional",
        )
        metrics = batch.metrics(0.5)
        assert metrics[f"risk/{profile}"] == pytest.approx(metric_value), profile
        assert [name for name in ("risk/mvar", "risk/rvar", "risk/risk_seeking") if name in metrics] == [
            f"risk/{profile}"
        ]
