"""Bundling (paper, section 4): matching each bundle group's completions into bundles and scoring the bundles.

Layout convention (TRL's): a generation batch is a 1-D tensor of ``P * G`` rewards, ``G`` consecutive completions per
prompt. Prompts are cut into ``P / B`` consecutive *bundle groups* of ``B`` prompts; every group yields ``G`` bundles.
A rule is a function registered in :data:`BUNDLINGS` (the config's ``bundling``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..registry import Registry

Bundles = tuple[torch.Tensor, torch.Tensor]
BundlingFn = Callable[..., Bundles]

BUNDLINGS: Registry[BundlingFn] = Registry("bundling", needs_help=True)


def _check_layout(rewards: torch.Tensor, num_generations: int, bundle_size: int, allow_partial_group: bool) -> int:
    """Validate the batch layout and return the number of prompts."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (P * G entries), got shape {tuple(rewards.shape)}.")
    if num_generations < 1 or bundle_size < 1:
        raise ValueError(f"num_generations ({num_generations}) and bundle_size ({bundle_size}) must be >= 1.")
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of num_generations={num_generations} completions."
        )
    num_prompts = rewards.numel() // num_generations
    if num_prompts % bundle_size != 0 and not allow_partial_group:
        raise ValueError(
            f"The batch holds {num_prompts} prompts, which is not a multiple of bundle_size={bundle_size}: every "
            "bundle needs one completion from each of bundle_size distinct prompts."
        )
    return num_prompts


def _score_bundles(rewards: torch.Tensor, slot: torch.Tensor, num_generations: int, bundle_size: int) -> Bundles:
    """Score the bundles given each completion's slot (``slot[i, j]``: the bundle slot of completion ``j`` of prompt
    ``i``).

    Unscorable (``NaN``) members do not count; a bundle's sum is rescaled to ``B / (scorable members)`` times itself so
    it stays on the scale of a full bundle, and a bundle without a scorable member scores ``NaN``."""
    num_prompts = slot.shape[0]
    num_groups = -(-num_prompts // bundle_size)  # the last group may be partial
    group = torch.arange(num_prompts, device=rewards.device) // bundle_size
    bundle_ids = (group.unsqueeze(1) * num_generations + slot.to(rewards.device)).reshape(-1)

    num_bundles = num_groups * num_generations
    values = rewards.to(torch.float64)
    scorable = ~torch.isnan(values)
    sums = torch.zeros(num_bundles, dtype=torch.float64, device=rewards.device)
    sums.index_add_(0, bundle_ids, torch.where(scorable, values, torch.zeros_like(values)))
    counts = torch.zeros(num_bundles, dtype=torch.float64, device=rewards.device)
    counts.index_add_(0, bundle_ids, scorable.to(torch.float64))
    full = counts == bundle_size
    bundle_scores = torch.where(full, sums, sums * bundle_size / counts)  # 0 / 0 -> NaN for an unscorable bundle
    return bundle_scores.to(rewards.dtype if rewards.is_floating_point() else torch.float32), bundle_ids


@BUNDLINGS.register("permutation", help="the paper: an independent uniform permutation of each prompt's completions")
def permutation_bundles(
    rewards: torch.Tensor,
    num_generations: int,
    bundle_size: int,
    generator: torch.Generator | None = None,
    allow_partial_group: bool = False,
) -> Bundles:
    """Randomly bundle ``B`` questions' answers and score each bundle (paper, section 4, "permutation bundling").

    For every prompt ``i`` an independent uniform permutation ``xi_i`` of its ``G`` completions is drawn; bundle ``j``
    of a group holds completion ``xi_i(j)`` of each of the group's ``B`` prompts, so every completion is used exactly
    once and a group gives ``G`` disjoint bundles. The bundle score is ``R_Bj = sum_i R(y^i_{xi_i(j)})``.

    Args:
        rewards: 1-D tensor of ``P * G`` rewards, ``G`` consecutive completions per prompt. ``NaN`` marks an
            unscorable completion (every reward function returned ``None``); see below.
        num_generations: ``G``, completions per prompt.
        bundle_size: ``B``, prompts per bundle; ``P`` must be a multiple of it. ``B = 1`` means no bundling.
        generator: source of the permutations. Pass one seeded identically on every process so all ranks bundle alike.
        allow_partial_group: let the last group hold fewer than ``B`` prompts when ``P`` is not a multiple of ``B``
            (its bundles are scored like bundles with unscorable members, below). For evaluation batches, whose last
            batch can be short; training batches are always whole groups.

    Returns:
        ``(bundle_scores, bundle_ids)``: ``bundle_scores`` has ``(P / B) * G`` entries; ``bundle_ids[k]`` is the
        bundle of completion ``k``. Unscorable completions do not count towards their bundle's score, which is
        rescaled to ``B / (scorable members)`` times their sum so it stays on the scale of a full bundle; a bundle with
        no scorable member scores ``NaN``. Without ``NaN`` rewards (and partial groups) the score is exactly the sum
        of the members.
    """
    num_prompts = _check_layout(rewards, num_generations, bundle_size, allow_partial_group)
    # argsort of i.i.d. continuous keys is a uniform random permutation per row; float64 keys make ties negligible.
    keys = torch.rand(num_prompts, num_generations, generator=generator, dtype=torch.float64)
    return _score_bundles(rewards, keys.argsort(dim=1), num_generations, bundle_size)


@BUNDLINGS.register("positional", help="the authors' code: completion j of every prompt of a group forms bundle j")
def positional_bundles(
    rewards: torch.Tensor,
    num_generations: int,
    bundle_size: int,
    generator: torch.Generator | None = None,
    allow_partial_group: bool = False,
) -> Bundles:
    """The authors' public code's pairing: completion ``j`` of every prompt of a group forms bundle ``j``.

    Same arguments and scoring as :func:`permutation_bundles`; ``generator`` is accepted for a uniform signature and
    not used. A prompt's completions are i.i.d. samples, so the bundles are distributed as the paper's; they are merely
    not re-drawn when the same batch is bundled twice."""
    del generator
    num_prompts = _check_layout(rewards, num_generations, bundle_size, allow_partial_group)
    slot = torch.arange(num_generations).expand(num_prompts, num_generations)
    return _score_bundles(rewards, slot, num_generations, bundle_size)
