"""The risk math of RiskPO as pure functions of tensors.

Everything here follows section 4 and Algorithm 1 of *RiskPO: Risk-based Policy Optimization via Verifiable Reward
for LLM Post-Training* (Ren et al., 2025). Nothing depends on the trainer, so each piece can be tested, benchmarked
and reused alone.

Layout convention (TRL's): a generation batch is a 1-D tensor of ``P * G`` rewards, ``G`` consecutive completions per
prompt. Prompts are cut into ``P / B`` consecutive *bundle groups* of ``B`` prompts; every group yields ``G`` bundles.

A batch's advantage is three choices, each a registry of pure functions looked up by name:

- :data:`BUNDLINGS`: how completions are matched into bundles (the paper's random permutations, or the authors'
  positional pairing);
- :data:`ADVANTAGE_VARIANTS`: the bundle advantage for a ``(advantage_scaling, risk_profile)`` pair (the paper's
  formulas, or the authors' code's scaling);
- :data:`CREDIT_ASSIGNMENTS`: how a bundle's advantage reaches its members (the paper gives each the same).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Quantile = float | torch.Tensor
Bundles = tuple[torch.Tensor, torch.Tensor]


# --- bundling ------------------------------------------------------------------------------------------------------


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


BundlingFn = Callable[..., Bundles]

BUNDLINGS: dict[str, BundlingFn] = {"permutation": permutation_bundles, "positional": positional_bundles}


# --- bundle advantages ---------------------------------------------------------------------------------------------


def _as_tensor(value: Quantile, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def rvar_window(
    scores: torch.Tensor, q_low: Quantile, q_high: Quantile, natural_baseline: bool = True
) -> torch.Tensor:
    """``g(z, a, b) = (z - a)^+ - (z - b)^+ + a - b`` of Theorem 1: the score-function weight of
    ``(b_level - a_level) * RVaR_{a_level:b_level}``. It is ``a - b`` below ``a``, rises linearly in ``[a, b]`` and is
    ``0`` above ``b``. ``natural_baseline=False`` drops the constant ``a - b`` (then ``0`` below ``a`` and ``b - a``
    above ``b``), as the authors' DAPO script does."""
    a, b = _as_tensor(q_low, scores), _as_tensor(q_high, scores)
    # min(max(z, a), b) - b equals (z - a)^+ - (z - b)^+ + a - b for a <= b, and is exactly 0 above b in floating
    # point (the sum of the four terms leaves rounding residue of ~1e-17 there, so "zero advantage" would not be zero).
    clipped = torch.minimum(torch.maximum(scores, a), b)
    return clipped - b if natural_baseline else clipped - a


def mvar_advantage(
    scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float, natural_baseline: bool = True
) -> torch.Tensor:
    """Bundle advantage of the MVaR objective (paper, eq. for ``A_j``)::

        A = -(1 + omega) * (q_alpha - R_B)^+ + g(R_B, q_alpha, q_beta)

    Its expectation against ``grad log pi`` is the gradient of
    ``J = (1 + omega) * alpha * RVaR_{0:alpha} + (beta - alpha) * RVaR_{alpha:beta}`` (eq. ``mvar`` with Theorem 1).
    ``A <= 0`` everywhere, ``A = 0`` above ``q_beta`` (the upper tail is excluded), the slope is ``1`` between the
    quantiles and ``1 + omega`` below ``q_alpha``. ``omega = 0`` gives ``CVaR_beta = RVaR_{0:beta}``,
    ``-(q_beta - R_B)^+``. ``natural_baseline=False`` drops ``g``'s constant ``q_alpha - q_beta`` (see
    :func:`rvar_window`).
    """
    lower_tail = (_as_tensor(q_alpha, scores) - scores).clamp(min=0)
    return -(1.0 + omega) * lower_tail + rvar_window(scores, q_alpha, q_beta, natural_baseline)


def rvar_advantage(
    scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float = 0.0, natural_baseline: bool = True
) -> torch.Tensor:
    """Bundle advantage of ``(beta - alpha) * RVaR_{alpha:beta}`` alone: ``g(R_B, q_alpha, q_beta)`` (Theorem 1).

    Both tails are excluded from the gradient; ``alpha = 0`` gives ``CVaR_beta``. ``omega`` is accepted for a uniform
    signature and ignored.
    """
    del omega
    return rvar_window(scores, q_alpha, q_beta, natural_baseline)


def risk_seeking_advantage(
    scores: torch.Tensor, q_alpha: Quantile, q_beta: Quantile, omega: float
) -> torch.Tensor:
    """Bundle advantage of the paper's risk-seeking ablation,
    ``J = (1 + omega) * (1 - beta) * RVaR_{beta:1} + (beta - alpha) * RVaR_{alpha:beta}``::

        A = (1 + omega) * (R_B - q_beta)^+ + (R_B - q_alpha)^+ - (R_B - q_beta)^+

    Theorem 1 gives the weight up to a constant (``g(R_B, q_beta, q_1)`` carries ``q_beta - q_1``); a constant leaves
    the expected gradient unchanged, and it is chosen so that the excluded lower tail gets ``A = 0``, mirroring MVaR,
    whose excluded upper tail gets ``A = 0``. Hence ``A >= 0`` everywhere.
    """
    upper_tail = (scores - _as_tensor(q_beta, scores)).clamp(min=0)
    return (1.0 + omega) * upper_tail + rvar_window(scores, q_alpha, q_beta, natural_baseline=False)


AdvantageFn = Callable[[torch.Tensor, Quantile, Quantile, float], torch.Tensor]

RISK_PROFILES: dict[str, AdvantageFn] = {
    "mvar": mvar_advantage,
    "rvar": rvar_advantage,
    "risk_seeking": risk_seeking_advantage,
}


def _nanstd_rows(rows: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation (ddof=1) of each row's finite entries (0 where fewer than two)."""
    finite = torch.isfinite(rows)
    count = finite.sum(dim=1)
    values = torch.where(finite, rows, torch.zeros_like(rows))
    mean = values.sum(dim=1) / count.clamp(min=1)
    squares = torch.where(finite, (rows - mean.unsqueeze(1)) ** 2, torch.zeros_like(rows)).sum(dim=1)
    return torch.where(count > 1, (squares / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(mean))


def _divide_by_group_std(advantage: torch.Tensor, scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The authors' code's last step: divide by the std (ddof=1) of the bundle group's ``G`` bundle scores. A group
    whose scores are all equal keeps the unscaled value (with group quantiles it is 0 there anyway)."""
    std = _nanstd_rows(scores.view(-1, num_generations)).repeat_interleave(num_generations)
    return advantage / torch.where(std > 0, std, torch.ones_like(std))


def authors_code_mvar_advantage(
    scores: torch.Tensor,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    *,
    alpha: float,
    beta: float,
    num_generations: int,
    natural_baseline: bool = True,
) -> torch.Tensor:
    """The MVaR advantage as the authors' public code scales it (an opt-in; the paper's is :func:`mvar_advantage`)::

        A = [omega * (-(q_alpha - R_B)^+ / alpha) + g(R_B, q_alpha, q_beta) / (beta - alpha)] / (1 + omega)

    i.e. the score-function weight of ``[omega * RVaR_{0:alpha} + RVaR_{alpha:beta}] / (1 + omega)``, then divided by
    the standard deviation of the bundle scores of its bundle group (``num_generations`` consecutive bundles). A group
    whose scores are all equal keeps the unscaled value rather than being divided by ~0. That code calls ``omega``
    ``w_mix`` and uses 1.5. Below ``q_alpha`` the slope is ``omega * (beta - alpha) / alpha`` times the window's
    (the paper's is ``1 + omega``): 4.5 at alpha = 0.2, beta = 0.8, i.e. the paper's shape with an effective omega of
    3.5 (4.25 at beta = 0.9), up to a positive factor. ``natural_baseline=False`` drops ``g``'s constant (the
    authors' ``natural_baseline_adv=False``).
    """
    if not 0 < alpha < beta <= 1:
        raise ValueError(
            f"The authors' MVaR scaling divides by alpha and beta - alpha; got alpha={alpha}, beta={beta}."
        )
    lower_tail = -(_as_tensor(q_alpha, scores) - scores).clamp(min=0) / alpha
    window = rvar_window(scores, q_alpha, q_beta, natural_baseline) / (beta - alpha)
    return _divide_by_group_std((omega * lower_tail + window) / (1.0 + omega), scores, num_generations)


def authors_code_risk_seeking_advantage(
    scores: torch.Tensor,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    *,
    alpha: float,
    beta: float,
    num_generations: int,
    natural_baseline: bool = True,
) -> torch.Tensor:
    """The risk-seeking advantage as the authors' public code scales it (their risky MATH script)::

        A = [omega * (R_B - q_beta)^+ / (1 - beta) + g(R_B, q_alpha, q_beta) / (beta - alpha)] / (1 + omega)

    then divided by the bundle group's score std, as :func:`authors_code_mvar_advantage`. That code calls ``omega``
    ``upper_weight`` and uses 1.5. Unlike the paper's form (:func:`risk_seeking_advantage`) the lower tail keeps
    ``g``'s negative constant unless ``natural_baseline=False``.
    """
    if not 0 <= alpha < beta < 1:
        raise ValueError(
            f"The authors' risk-seeking scaling divides by 1 - beta and beta - alpha; got alpha={alpha}, beta={beta}."
        )
    upper_tail = (scores - _as_tensor(q_beta, scores)).clamp(min=0) / (1.0 - beta)
    window = rvar_window(scores, q_alpha, q_beta, natural_baseline) / (beta - alpha)
    return _divide_by_group_std((omega * upper_tail + window) / (1.0 + omega), scores, num_generations)


@dataclass(frozen=True)
class AdvantageVariant:
    """One row of :data:`ADVANTAGE_VARIANTS`: a bundle-advantage function and what it needs.

    ``fn(scores, q_alpha, q_beta, omega, *, alpha, beta, num_generations, natural_baseline)`` returns one advantage
    per bundle. ``levels_ok(alpha, beta)`` says whether the quantile levels are allowed (``levels_rule`` says it in
    words, for error messages). ``has_natural_baseline``: the formula carries ``g``'s ``q_alpha - q_beta`` constant,
    so ``natural_baseline=False`` changes it. ``group_std``: it divides by the bundle group's score std."""

    fn: Callable[..., torch.Tensor]
    levels_ok: Callable[[float, float], bool]
    levels_rule: str
    has_natural_baseline: bool
    group_std: bool


def _paper_mvar(scores, q_alpha, q_beta, omega, *, natural_baseline, **_):
    return mvar_advantage(scores, q_alpha, q_beta, omega, natural_baseline)


def _paper_rvar(scores, q_alpha, q_beta, omega, *, natural_baseline, **_):
    return rvar_advantage(scores, q_alpha, q_beta, omega, natural_baseline)


def _paper_risk_seeking(scores, q_alpha, q_beta, omega, **_):
    return risk_seeking_advantage(scores, q_alpha, q_beta, omega)


def _any_levels(alpha: float, beta: float) -> bool:
    return 0 <= alpha < beta <= 1


ADVANTAGE_VARIANTS: dict[tuple[str, str], AdvantageVariant] = {
    # (advantage_scaling, risk_profile): the paper's formulas ...
    ("none", "mvar"): AdvantageVariant(_paper_mvar, _any_levels, "0 <= alpha < beta <= 1", True, False),
    ("none", "rvar"): AdvantageVariant(_paper_rvar, _any_levels, "0 <= alpha < beta <= 1", True, False),
    ("none", "risk_seeking"): AdvantageVariant(
        _paper_risk_seeking, _any_levels, "0 <= alpha < beta <= 1", False, False
    ),
    # ... and the authors' code's scaling (quantile levels in the denominators, then the group std).
    ("authors_code", "mvar"): AdvantageVariant(
        authors_code_mvar_advantage, lambda a, b: 0 < a < b <= 1, "risk_alpha > 0 (it divides by alpha)", True, True
    ),
    ("authors_code", "risk_seeking"): AdvantageVariant(
        authors_code_risk_seeking_advantage, lambda a, b: 0 <= a < b < 1, "risk_beta < 1 (it divides by 1 - beta)",
        True, True,
    ),
}

ADVANTAGE_SCALINGS = tuple(dict.fromkeys(scaling for scaling, _ in ADVANTAGE_VARIANTS))


def advantage_variant(advantage_scaling: str, risk_profile: str) -> AdvantageVariant:
    """The registered variant for a scaling and profile, or a ``ValueError`` naming the valid choices."""
    if risk_profile not in RISK_PROFILES:
        raise ValueError(f"Unknown risk_profile {risk_profile!r}; choose one of {sorted(RISK_PROFILES)}.")
    if advantage_scaling not in ADVANTAGE_SCALINGS:
        raise ValueError(f"Unknown advantage_scaling {advantage_scaling!r}; choose one of {list(ADVANTAGE_SCALINGS)}.")
    variant = ADVANTAGE_VARIANTS.get((advantage_scaling, risk_profile))
    if variant is None:
        profiles = sorted(profile for scaling, profile in ADVANTAGE_VARIANTS if scaling == advantage_scaling)
        raise ValueError(
            f"advantage_scaling={advantage_scaling!r} is defined for risk_profile in {profiles}, not {risk_profile!r}."
        )
    return variant


# --- credit assignment ---------------------------------------------------------------------------------------------


def _prompt_rows(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    return rewards.to(torch.float64).view(-1, num_generations)


def uniform_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """Every member gets its bundle's advantage (the paper)."""
    return advantages


def score_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """The authors' ``'score'`` mode: half the bundle's advantage for a rewarded member (reward > 0), 1.5 times it
    otherwise."""
    return advantages * torch.where(rewards.to(advantages.dtype) > 0, 0.5, 1.5)


def std_credit(
    advantages: torch.Tensor, rewards: torch.Tensor, bundle_ids: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """The authors' ``'std'`` mode (both MATH scripts): divide by the member's prompt's reward std over its ``G``
    completions (ddof=1); a std <= 1e-3 counts as 1."""
    std = _nanstd_rows(_prompt_rows(rewards, num_generations))
    std = torch.where(std > 1e-3, std, torch.ones_like(std)).repeat_interleave(num_generations)
    return advantages / std.to(advantages.dtype)


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


CreditFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]

CREDIT_ASSIGNMENTS: dict[str, CreditFn] = {
    "uniform": uniform_credit,
    "score": score_credit,
    "std": std_credit,
    "sum_mean": sum_mean_credit,
}


# --- quantiles and metrics -----------------------------------------------------------------------------------------


def group_quantiles(bundle_scores: torch.Tensor, num_generations: int, levels: list[float]) -> torch.Tensor:
    """Empirical (linear) quantiles within each bundle group, repeated for every bundle: shape ``(bundles, levels)``.

    This is where the authors' public code takes the quantiles of its advantage from (an opt-in here; the paper tracks
    them across batches)."""
    rows = bundle_scores.to(torch.float64).view(-1, num_generations)
    per_group = torch.nanquantile(rows, torch.as_tensor(levels, dtype=torch.float64), dim=1).T
    return per_group.repeat_interleave(num_generations, dim=0)


def empirical_quantiles(scores: torch.Tensor, levels: torch.Tensor | list[float]) -> torch.Tensor:
    """Linear-interpolation empirical quantiles of the finite entries of ``scores`` (``NaN`` when there are none)."""
    levels_t = torch.as_tensor(levels, dtype=torch.float64)
    finite = scores[torch.isfinite(scores)].to(torch.float64).cpu()
    if finite.numel() == 0:
        return torch.full_like(levels_t, float("nan"))
    return torch.quantile(finite, levels_t)


def push_signals(advantages: torch.Tensor, rewards: torch.Tensor | None = None) -> dict[str, float]:
    """Which way a batch pushes its completions: the shares with a negative and with a positive advantage (beyond
    1e-6) and, given the rewards, the Pearson correlation between a completion's own reward and its advantage (left
    out when either has no spread). Empty for an empty batch."""
    adv = advantages.double()
    if not adv.numel():
        return {}
    signals = {
        "frac_negative_advantage": (adv < -1e-6).double().mean().item(),
        "frac_positive_advantage": (adv > 1e-6).double().mean().item(),
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
        return torch.tensor(float("nan"))
    q_alpha_t, q_beta_t = _as_tensor(q_alpha, scores), _as_tensor(q_beta, scores)
    weight = (1.0 + omega) * (scores <= q_alpha_t) + ((scores > q_alpha_t) & (scores <= q_beta_t))
    return (scores * weight)[finite].mean()


@dataclass
class RiskPOBatch:
    """What one generation batch's risk step produced; every tensor covers the whole (gathered) batch."""

    advantages: torch.Tensor  # one per completion; never NaN
    bundle_ids: torch.Tensor  # one per completion
    bundle_scores: torch.Tensor  # one per bundle; NaN for a bundle without a scorable member
    q_alpha: float | torch.Tensor  # one value, or one per bundle (quantiles taken per bundle group)
    q_beta: float | torch.Tensor
    unscorable: torch.Tensor | None = None  # one bool per completion: no reward function scored it
    rewards: torch.Tensor | None = None  # one per completion, NaN where unscorable
    num_generations: int | None = None  # completions per prompt (G), for the per-prompt metrics

    def metrics(self, omega: float) -> dict[str, float]:
        """The per-batch ``risk/*`` metrics the trainer logs (per-bundle quantiles are logged as their mean).

        ``risk/lower_rvar`` / ``risk/upper_rvar`` are left out when no bundle of the batch lies in that tail (e.g. no
        bundle ever scores above ``q_beta`` when ``beta = 1`` or when the top bundles tie at ``q_beta``): an empty
        mean is not a value."""
        scores = self.bundle_scores
        finite = torch.isfinite(scores)
        q_alpha, q_beta = _as_tensor(self.q_alpha, scores), _as_tensor(self.q_beta, scores)
        lower = scores[finite & (scores <= q_alpha)]
        upper = scores[finite & (scores > q_beta)]
        finite_scores = scores[finite]
        nan = float("nan")
        unscorable = self.unscorable if self.unscorable is not None else torch.zeros_like(self.advantages, dtype=bool)
        metrics = {
            "risk/q_alpha": q_alpha.float().mean().item(),
            "risk/q_beta": q_beta.float().mean().item(),
            "risk/bundle_score_mean": finite_scores.mean().item() if finite_scores.numel() else nan,
            "risk/bundle_score_std": finite_scores.std().item() if finite_scores.numel() > 1 else nan,
            "risk/mvar": mvar_objective(self.bundle_scores, self.q_alpha, self.q_beta, omega).item(),
            "risk/frac_zero_advantage": (self.advantages == 0).float().mean().item(),
            "risk/frac_unscorable": unscorable.float().mean().item() if unscorable.numel() else 0.0,
            "risk/advantage_mean": self.advantages.mean().item(),
        }
        if lower.numel():
            metrics["risk/lower_rvar"] = lower.mean().item()
        if upper.numel():
            metrics["risk/upper_rvar"] = upper.mean().item()
        metrics.update(self.push_metrics())
        return metrics

    def push_metrics(self) -> dict[str, float]:
        """:func:`push_signals` over the scorable completions and :func:`frac_prompts_all_failed`, as ``risk/*``
        metrics. The second is what the regime guard watches (see ``RiskPOConfig.regime_guard_threshold``)."""
        scorable = ~self.unscorable if self.unscorable is not None else torch.ones_like(self.advantages, dtype=bool)
        if not scorable.any():
            return {}
        rewards = self.rewards[scorable] if self.rewards is not None else None
        metrics = {f"risk/{name}": value for name, value in push_signals(self.advantages[scorable], rewards).items()}
        if self.rewards is not None and self.num_generations:
            failed = frac_prompts_all_failed(self.rewards, self.num_generations)
            if failed is not None:
                metrics["risk/frac_prompts_all_failed"] = failed
        return metrics


# --- one batch -----------------------------------------------------------------------------------------------------


def riskpo_advantages(
    rewards: torch.Tensor,
    *,
    num_generations: int,
    bundle_size: int,
    q_alpha: Quantile,
    q_beta: Quantile,
    omega: float,
    risk_profile: str = "mvar",
    bundles: Bundles | None = None,
    generator: torch.Generator | None = None,
    advantage_scaling: str = "none",
    levels: tuple[float, float] | None = None,
    natural_baseline: bool = True,
    credit_assignment: str = "uniform",
    bundling: str = "permutation",
) -> RiskPOBatch:
    """Bundle a batch, score it against the given quantiles and spread each bundle's advantage to its members.

    This is lines 6 and 8 of Algorithm 1 without the tracker update (line 7), which the caller does in between so the
    quantiles can come from a tracker, from the batch itself, or from anywhere else (:class:`~riskpo_trl.estimator.
    RiskEstimator` does all three for the trainer).

    Args:
        rewards: ``P * G`` rewards, ``NaN`` for an unscorable completion.
        num_generations, bundle_size: ``G`` and ``B``.
        q_alpha, q_beta: the quantiles; floats, 0-d tensors or one value per bundle.
        omega: the tail weight (``w_mix`` / ``upper_weight`` in the authors' scaling).
        risk_profile, advantage_scaling: pick the row of :data:`ADVANTAGE_VARIANTS`; ``"authors_code"`` needs
            ``levels=(alpha, beta)``.
        bundles: a bundling to reuse (``(scores, ids)`` from :data:`BUNDLINGS`); without it one is drawn with the
            ``bundling`` rule from ``generator``.
        natural_baseline: keep ``g``'s ``q_alpha - q_beta`` constant (the paper); ``False`` drops it.
        credit_assignment: a key of :data:`CREDIT_ASSIGNMENTS`; ``"uniform"`` (the paper) gives every member its
            bundle's advantage.

    Unscorable completions (``NaN`` reward) get advantage ``0``; so do all members of a bundle that has no scorable
    member. Every other completion gets its (credited) bundle advantage, so the result is never ``NaN``.
    """
    variant = advantage_variant(advantage_scaling, risk_profile)
    if credit_assignment not in CREDIT_ASSIGNMENTS:
        raise ValueError(f"Unknown credit_assignment {credit_assignment!r}; choose one of {list(CREDIT_ASSIGNMENTS)}.")
    if bundles is None:
        if bundling not in BUNDLINGS:
            raise ValueError(f"Unknown bundling {bundling!r}; choose one of {list(BUNDLINGS)}.")
        bundles = BUNDLINGS[bundling](rewards, num_generations, bundle_size, generator)
    if variant.group_std and levels is None:
        raise ValueError(
            f"advantage_scaling={advantage_scaling!r} needs the quantile levels: pass levels=(alpha, beta)."
        )
    alpha, beta = levels if levels is not None else (None, None)
    bundle_scores, bundle_ids = bundles
    bundle_adv = variant.fn(
        bundle_scores.to(torch.float64), q_alpha, q_beta, omega,
        alpha=alpha, beta=beta, num_generations=num_generations, natural_baseline=natural_baseline,
    )
    advantages = CREDIT_ASSIGNMENTS[credit_assignment](bundle_adv[bundle_ids], rewards, bundle_ids, num_generations)
    unscorable = torch.isnan(rewards)
    advantages = torch.where(unscorable, torch.zeros_like(advantages), advantages)
    advantages = torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0).to(torch.float32)
    return RiskPOBatch(
        advantages=advantages,
        bundle_ids=bundle_ids,
        bundle_scores=bundle_scores,
        q_alpha=_as_float_or_tensor(q_alpha),
        q_beta=_as_float_or_tensor(q_beta),
        unscorable=unscorable,
        rewards=rewards,
        num_generations=num_generations,
    )


def _as_float_or_tensor(value: Quantile) -> float | torch.Tensor:
    return float(value) if not isinstance(value, torch.Tensor) or value.numel() == 1 else value
