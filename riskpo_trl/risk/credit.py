"""Credit assignment: how a bundle's advantage reaches its members (the config's ``credit_assignment``).

Each rule is a function ``(advantages, rewards, bundle_ids, num_generations) -> advantages`` registered in
:data:`CREDIT_ASSIGNMENTS`; the paper gives every member its bundle's advantage, the others are the authors' code's.
An entry from the authors' code names the advantage ``scaling`` it belongs with, whether the config checks refuse or
warn about another (``other_scaling``) and why (``reason``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import Registry, Says
from .quantiles import nanstd_rows

CreditFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]

CREDIT_ASSIGNMENTS: Registry[CreditFn] = Registry(
    "credit_assignment",
    spec={
        "scaling": Says(str, "the advantage scaling the rule comes from", False, ("other_scaling", "reason")),
        "other_scaling": Says(
            str, "what the config does with another scaling", False, ("scaling", "reason"), ("refuse", "warn")
        ),
        "reason": Says(str, "why, the end of the config's refusal or warning", False, ("scaling", "other_scaling")),
    },
    needs_help=True,
)


def _prompt_rows(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    return rewards.to(torch.float64).view(-1, num_generations)


@CREDIT_ASSIGNMENTS.register("uniform", help="the paper: all the same")
def uniform_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """Every member gets its bundle's advantage (the paper)."""
    return advantages


# With another advantage scaling than the one a rule comes from: refused, or warned about, with its entry's reason.
RESCALES_BY_PROMPT = (
    "rescales members by their prompt's reward statistics, which only the authors' scaling uses (their scripts: "
    "advantage_scaling='authors_code', quantile_source='group'); with the paper's advantage it multiplies some "
    "prompts' advantages several fold. Set advantage_scaling='authors_code' and quantile_source='group', or "
    "credit_assignment='uniform' (the paper)."
)


@CREDIT_ASSIGNMENTS.register(
    "score",
    help="x0.5 for a rewarded member, x1.5 otherwise",
    scaling="authors_code",
    other_scaling="warn",
    reason="(x0.5 for rewarded members, x1.5 otherwise) comes from the authors' code and none of their scripts uses "
    "it; with the paper's advantage it is an untested mix.",
)
def score_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """The authors' ``'score'`` mode: half the bundle's advantage for a rewarded member (reward > 0), 1.5 times it
    otherwise."""
    return advantages * torch.where(rewards.to(advantages.dtype) > 0, 0.5, 1.5)


@CREDIT_ASSIGNMENTS.register(
    "std",
    help="divided by the member's prompt's reward std over its G completions, std <= "
    "1e-3 counts as 1; the authors' MATH scripts",
    scaling="authors_code",
    other_scaling="refuse",
    reason=RESCALES_BY_PROMPT,
)
def std_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """The authors' ``'std'`` mode (both MATH scripts): divide by the member's prompt's reward std over its ``G``
    completions (ddof=1); a std <= 1e-3 counts as 1."""
    std = nanstd_rows(_prompt_rows(rewards, num_generations))
    std = torch.where(std > 1e-3, std, torch.ones_like(std)).repeat_interleave(num_generations)
    return advantages / std.to(advantages.dtype)


@CREDIT_ASSIGNMENTS.register(
    "sum_mean",
    help="A x (r - prompt mean) / sum over the bundle of (r - prompt mean), A / B when that sum is ~0; the authors' "
    "DAPO script",
    scaling="authors_code",
    other_scaling="refuse",
    reason=RESCALES_BY_PROMPT,
)
def sum_mean_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """The authors' ``'sum-mean'`` mode (DAPO script): member ``k`` of a bundle gets ``A * d_k / sum_bundle d``,
    ``d_k = r_k - mean`` (its prompt's mean reward over its ``G`` completions), or ``A / (members)`` where that sum is
    within 1e-6 of 0. Unscorable members have ``d = 0`` and do not count as members."""
    rows = _prompt_rows(rewards, num_generations)
    finite = torch.isfinite(rows)
    means = torch.where(finite, rows, torch.zeros_like(rows)).sum(1) / finite.sum(1).clamp(min=1)
    deviation = torch.where(finite, rows - means.unsqueeze(1), torch.zeros_like(rows)).reshape(-1)
    num_bundles = int(bundle_ids.max().item()) + 1 if bundle_ids.numel() else 0
    deviation_sum = torch.zeros(num_bundles, dtype=torch.float64, device=rewards.device)
    deviation_sum.index_add_(0, bundle_ids, deviation)
    members = torch.zeros(num_bundles, dtype=torch.float64, device=rewards.device)
    members.index_add_(0, bundle_ids, finite.reshape(-1).to(torch.float64))
    total, count = deviation_sum[bundle_ids], members[bundle_ids].clamp(min=1)
    share = torch.where(total.abs() > 1e-6, deviation / torch.where(total.abs() > 1e-6, total, 1.0), 1.0 / count)
    return advantages * share.to(advantages.dtype)
