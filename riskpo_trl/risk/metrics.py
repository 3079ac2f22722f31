"""Per-batch signals of a RiskPO batch, as pure functions: which way the advantages push, the share of prompts that
are all wrong, and each risk profile's objective estimated on the batch's bundle scores."""

from __future__ import annotations

import torch

from .quantiles import Quantile, as_tensor_like

# An advantage within this of 0 counts as zero. A baseline subtracted in float64 can leave a residue of about 1e-16
# where the value is 0, and its sign differs between CPU and CUDA.
ZERO_ADVANTAGE_TOLERANCE = 1e-6


def push_signals(advantages: torch.Tensor, rewards: torch.Tensor | None = None) -> dict[str, float]:
    """Which way a batch pushes its completions: the shares with a negative and with a positive advantage (beyond
    ``ZERO_ADVANTAGE_TOLERANCE``) and, given the rewards, the Pearson correlation between a completion's own reward
    and its advantage (left out when either has no spread). Empty for an empty batch."""
    adv = advantages.double()
    if not adv.numel():
        return {}
    signals = {
        "frac_negative_advantage": (adv < -ZERO_ADVANTAGE_TOLERANCE).double().mean().item(),
        "frac_positive_advantage": (adv > ZERO_ADVANTAGE_TOLERANCE).double().mean().item(),
    }
    if rewards is not None:
        r_c, a_c = rewards.double() - rewards.double().mean(), adv - adv.mean()
        denom = (r_c.pow(2).sum() * a_c.pow(2).sum()).sqrt()
        if denom > 1e-12:
            signals["reward_advantage_corr"] = ((r_c * a_c).sum() / denom).item()
    return signals


def frac_prompts_all_failed(rewards: torch.Tensor, num_generations: int) -> float | None:
    """Share of prompts none of whose scorable completions scored above 0: with RLVR's correctness rewards (1/0 or
    1/-1) the prompts that are all wrong, where the paper's advantage can only push down. Prompts with no scorable
    completion do not count; ``None`` when no prompt does. (A reward that pays something for a wrong answer, e.g. a
    format bonus, makes this undercount.)"""
    rows = rewards.double().view(-1, num_generations)
    finite = torch.isfinite(rows)
    counted = finite.any(dim=1)
    if not counted.any():
        return None
    best = torch.where(finite, rows, torch.full_like(rows, -torch.inf)).max(dim=1).values
    return (best[counted] <= 0).double().mean().item()


def mvar_objective(scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float) -> torch.Tensor:
    """Batch estimate of the bundled MVaR objective (section 4)::

    mean_j R_Bj * ((1 + omega) * 1{R_Bj <= q_alpha} + 1{q_alpha < R_Bj <= q_beta})
    """
    finite = torch.isfinite(scores)
    if not finite.any():
        return torch.tensor(float("nan"), device=scores.device)
    q_alpha_t, q_beta_t = as_tensor_like(q_alpha, scores), as_tensor_like(q_beta, scores)
    weight = (1.0 + omega) * (scores <= q_alpha_t) + ((scores > q_alpha_t) & (scores <= q_beta_t))
    return (scores * weight)[finite].mean()


def _weighted_mean(scores: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(scores)
    if not finite.any():
        return torch.tensor(float("nan"), device=scores.device)
    return (scores * weight)[finite].mean()


def rvar_objective(scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float = 0.0) -> torch.Tensor:
    """Batch estimate of ``(beta - alpha) * RVaR_{alpha:beta}`` of the bundle scores::

        mean_j R_Bj * 1{q_alpha < R_Bj <= q_beta}

    ``omega`` is accepted for a uniform signature and ignored."""
    del omega
    q_alpha_t, q_beta_t = as_tensor_like(q_alpha, scores), as_tensor_like(q_beta, scores)
    return _weighted_mean(scores, ((scores > q_alpha_t) & (scores <= q_beta_t)).to(scores.dtype))


def risk_seeking_objective(scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float) -> torch.Tensor:
    """Batch estimate of the risk-seeking objective
    ``(1 + omega) * (1 - beta) * RVaR_{beta:1} + (beta - alpha) * RVaR_{alpha:beta}``::

        mean_j R_Bj * ((1 + omega) * 1{R_Bj > q_beta} + 1{q_alpha < R_Bj <= q_beta})
    """
    q_alpha_t, q_beta_t = as_tensor_like(q_alpha, scores), as_tensor_like(q_beta, scores)
    weight = (1.0 + omega) * (scores > q_beta_t) + ((scores > q_alpha_t) & (scores <= q_beta_t))
    return _weighted_mean(scores, weight.to(scores.dtype))
