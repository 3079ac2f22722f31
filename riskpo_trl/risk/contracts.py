"""The contracts every registered risk profile and advantage baseline keeps, as checks a plug-in can run on its own.

A new entry passes them in its own tests (``tests/test_risk.py`` and ``tests/test_baselines.py`` run them on every
registered entry)::

    from riskpo_trl.risk.contracts import baseline_contract_violations, expected_gradient_gap

    assert expected_gradient_gap(RISK_PROFILES["my_profile"]) < 1e-4
    assert baseline_contract_violations(ADVANTAGE_BASELINES["mine"], ADVANTAGE_BASELINES.about("mine")) == []
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

# The expected-gradient check's tolerance that every registered profile meets (quadrature and finite differences).
EXPECTED_GRADIENT_TOLERANCE = 1e-4


def normal_expectation(fn: Callable[[torch.Tensor], torch.Tensor], theta: float = 0.7) -> float:
    """E[fn(R) * d/dtheta log f_theta(R)] for R ~ N(theta, 1), by quadrature."""
    x = torch.linspace(theta - 12, theta + 12, 240_001, dtype=torch.float64)
    density = torch.exp(-0.5 * (x - theta) ** 2) / math.sqrt(2 * math.pi)
    return torch.trapezoid(fn(x) * (x - theta) * density, x).item()


def expected_gradient_gap(profile: Any, alpha: float = 0.2, beta: float = 0.8, omega: float = 0.5) -> float:
    """|E[A * d log pi] - dJ/dtheta| for ``profile`` (a registered `RiskProfile`, its own parameters at their
    defaults) on R ~ N(theta, 1) with the true quantiles: the score-function gradient of its advantage (quadrature)
    against the derivative of its own registered objective (a central difference on a fine grid of the distribution,
    every quantile moving with theta). Theorem 1's claim, per profile: a registered profile's gap is below
    `EXPECTED_GRADIENT_TOLERANCE`."""
    theta, step = 0.7, 1e-3
    grid = torch.distributions.Normal(0.0, 1.0).icdf((torch.arange(200_000, dtype=torch.float64) + 0.5) / 200_000)

    def quantiles(location: float) -> tuple[float, float]:
        standard = torch.distributions.Normal(0.0, 1.0)
        return tuple(
            location + standard.icdf(torch.tensor(level, dtype=torch.float64)).item() if level > 0 else -1e9
            for level in (alpha, beta)
        )

    def objective(location: float) -> float:
        return profile.estimate(location + grid, *quantiles(location), omega).item()

    derivative = (objective(theta + step) - objective(theta - step)) / (2 * step)
    qa, qb = quantiles(theta)
    score_function = normal_expectation(lambda x: profile(x, qa, qb, omega), theta)
    return abs(score_function - derivative)


def baseline_contract_violations(
    baseline: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    about: Mapping[str, Any],
    num_generations: int = 4,
    prompts: int = 3,
) -> list[str]:
    """What ``baseline`` breaks of the contract its registry entry (``about``) states: a centred one gives each
    prompt's advantages a mean of 0 (over random draws, every completion scorable); one that does not use a
    completion's own reward moves that completion's result by exactly what its own advantage moves."""
    generator = torch.Generator().manual_seed(0)
    scorable = torch.ones(prompts * num_generations, dtype=torch.bool)
    broken = []
    draws = torch.randn(500, prompts * num_generations, generator=generator, dtype=torch.float64) - 0.7
    outputs = torch.stack([baseline(draw, scorable, num_generations) for draw in draws])
    prompt_means = outputs.view(len(draws), prompts, num_generations).mean(dim=2)
    if about["centred"] and prompt_means.mean().abs() > 1e-6:
        broken.append(f"centred, but its prompts' advantages average {prompt_means.mean().item():+.3f}")
    if not about["uses_own_reward"]:
        for j in range(num_generations):
            moved = draws[0].clone()
            moved[j] += 1.0
            change = baseline(moved, scorable, num_generations)[j] - outputs[0][j]
            if not torch.isclose(change, torch.tensor(1.0, dtype=change.dtype)):
                broken.append(
                    f"completion {j}'s own advantage enters its baseline (a +1 moved it {change.item():+.3f})"
                )
                break
    return broken
