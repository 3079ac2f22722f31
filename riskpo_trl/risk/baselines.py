"""Advantage baselines (the config's ``advantage_baseline``): a control variate subtracted from every completion's
advantage after credit assignment.

The score-function gradient is unchanged by subtracting any ``c`` that does not depend on the completion itself:
``E[c * grad log pi(y|x)] = c * grad sum_y pi(y|x) = 0``. So a baseline changes which completions are pushed up and
which down, not what the estimator's expectation is (at fixed quantiles). Each rule is a function
``(advantages, scorable, num_generations) -> advantages`` registered in :data:`ADVANTAGE_BASELINES`; it sees the whole
gathered batch, ``G`` consecutive completions per prompt, so every process computes the same values. Each entry says
how a model card names it (``card``), whether each prompt's advantages average 0 (``centred``) and whether a
completion's own advantage enters its baseline (``uses_own_reward``): the registry's spec, so an entry without one is
refused when it is registered. :func:`~riskpo_trl.risk.contracts.baseline_contract_violations` checks the last two
(``tests/test_baselines.py``, for every entry).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import Registry, Says

BaselineFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]

ADVANTAGE_BASELINES: Registry[BaselineFn] = Registry(
    "advantage_baseline",
    spec={
        "card": Says(str, "how a model card names the baseline ('with <card> (advantage_baseline=...)')"),
        "centred": Says(bool, "whether each prompt's advantages average 0 after it (its contract test checks it)"),
        "uses_own_reward": Says(
            bool, "whether a completion's own advantage enters its baseline (its contract test checks it)"
        ),
    },
    needs_help=True,
)


@ADVANTAGE_BASELINES.register(
    "none", help="the paper: no baseline", card="no baseline", centred=False, uses_own_reward=False
)
def no_baseline(advantages: torch.Tensor, scorable: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The paper's advantages, unchanged."""
    return advantages


@ADVANTAGE_BASELINES.register(
    "loo",
    help="per prompt, subtract the mean advantage of the prompt's other scorable completions (RLOO-style), so "
    "each prompt's advantages sum to 0 and take both signs; the expected gradient is unchanged at fixed quantiles",
    card="a leave-one-out baseline",
    centred=True,
    uses_own_reward=False,
)
def leave_one_out_baseline(advantages: torch.Tensor, scorable: torch.Tensor, num_generations: int) -> torch.Tensor:
    """``A'_ij = A_ij - mean_{k != j} A_ik`` over prompt ``i``'s other scorable completions.

    The mean leaves ``y_ij`` out and the other completions of the prompt sit in other bundles than ``y_ij``'s (one per
    bundle of the group), so the baseline does not depend on ``y_ij``: with bundling it is a bundle-level
    leave-one-out within the bundle group. Unscorable completions keep advantage 0 and are left out of their prompt's
    mean; a prompt with fewer than two scorable completions gets 0. Per prompt the result sums to 0.
    """
    rows = advantages.to(torch.float64).view(-1, num_generations)
    mask = scorable.view(-1, num_generations).to(rows.device)
    values = torch.where(mask, rows, torch.zeros_like(rows))
    count = mask.sum(dim=1, keepdim=True)
    others = (values.sum(dim=1, keepdim=True) - values) / (count - 1).clamp(min=1)
    centred = torch.where(mask & (count > 1), rows - others, torch.zeros_like(rows))
    return centred.reshape(-1).to(advantages.dtype)


def check_baseline_pair(advantage_baseline: str, advantage_scaling: str) -> None:
    """Refuse a baseline with the authors' scaling: their group-std division and group quantiles make every
    completion's advantage depend on its whole bundle group, so no per-prompt mean is free of the completion itself.
    The names themselves are checked where they are resolved (:meth:`~riskpo_trl.risk.choices.RiskChoices.resolve`)."""
    if advantage_baseline != "none" and advantage_scaling == "authors_code":
        raise ValueError(
            f"advantage_baseline={advantage_baseline!r} with advantage_scaling='authors_code': that scaling divides "
            "by each bundle group's score std and takes the group's own quantiles, so the other completions' "
            "advantages depend on the completion itself and the baseline would bias the gradient. Set "
            "advantage_baseline='none' (the authors' code has no baseline), or advantage_scaling='none' for the "
            "paper's advantage with a baseline."
        )
