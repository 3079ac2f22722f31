"""The checks of a :class:`~riskpo_trl.trainer.config.RiskPOConfig`, run once when it is built
(:func:`check_config`): the risk fields, the combinations no source uses, and the batch layout that GRPOConfig's own
checks derive."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from typing import Any

from .. import compat
from ..compat import TRL_LOSS_TYPES
from ..registry import closest_name
from ..risk.advantages import ADVANTAGE_SCALINGS
from ..risk.choices import RiskChoices
from ..risk.credit import CREDIT_ASSIGNMENTS
from ..risk.defaults import warn_if_resolved_by_scaling
from .batch_layout import bundle_layout_error, divisors
from .caller_warnings import caller_stacklevel


def check_loss_type(args: Any) -> None:
    """Raise for a ``loss_type`` no TRL loss has, which TRL would refuse only at the first step, after loading."""
    loss_type = getattr(args, "loss_type", None)
    if loss_type is None or loss_type in TRL_LOSS_TYPES:
        return
    hint = closest_name(loss_type, TRL_LOSS_TYPES) if isinstance(loss_type, str) else ""
    raise ValueError(f"loss_type={loss_type!r} is unknown{hint}; choose one of {list(TRL_LOSS_TYPES)} (TRL's losses).")


def check_config(config: Any, grpo_checks: Callable[[], None]) -> None:
    """Check ``config``'s own fields first (a bad one would otherwise surface as a less clear GRPOConfig error), then
    run ``grpo_checks`` (GRPOConfig's ``__post_init__``, which derives the generation batch), then the batch layout."""
    _check_risk_fields(config)
    _refuse_unsourced_combinations(config)
    check_loss_type(config)
    grpo_checks()
    _check_batch_layout(config)
    _check_token_mean_groups(config)


def json_object(field_name: str, value: Any) -> dict | None:
    """``value`` as a dict: a JSON object given as text (the command line) is parsed; a ``ValueError`` names the
    field when the text is no JSON object."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{field_name}={value!r} is not JSON ({error}); write a JSON object: '{{\"eta\": 2.0}}'."
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{field_name}={value!r} must be a JSON object of names and values: '{{\"eta\": 2.0}}'.")
    return parsed


def _check_risk_fields(config: Any) -> None:
    # The named choices, the pairs they form and the quantile levels they allow: checked where they are resolved.
    RiskChoices.from_config(config).resolve((config.risk_alpha, config.risk_beta))
    warn_if_resolved_by_scaling(config.advantage_baseline, config.advantage_scaling)
    if config.risk_omega < 0:
        raise ValueError(
            f"risk_omega={config.risk_omega} must be >= 0: it is the extra weight on the lower tail (the paper uses "
            "0.5; 0 gives CVaR)."
        )
    if config.bundle_size < 1:
        raise ValueError(f"bundle_size={config.bundle_size} must be >= 1 (1 disables bundling; the paper uses 5).")
    if config.max_unscorable_batches < 0:
        raise ValueError(
            f"max_unscorable_batches={config.max_unscorable_batches} must be >= 0 (0 never stops the run)."
        )
    if not 0 < config.regime_guard_threshold <= 1:
        raise ValueError(
            f"regime_guard_threshold={config.regime_guard_threshold} is a share of prompts (those with no completion "
            "rewarded above 0): it must be in (0, 1]."
        )
    if config.regime_guard_patience < 0:
        raise ValueError(
            f"regime_guard_patience={config.regime_guard_patience} must be >= 0 (0 disables the regime guard)."
        )
    if config.quantile_lr <= 0:
        raise ValueError(f"quantile_lr={config.quantile_lr} must be > 0 (the authors' code uses 0.1).")
    if config.quantile_lr_decay < 0:
        raise ValueError(f"quantile_lr_decay={config.quantile_lr_decay} must be >= 0 (0 keeps the step constant).")
    if config.num_generations is None or config.num_generations < 2:
        raise ValueError(
            f"num_generations={config.num_generations} must be >= 2: each prompt needs several completions to "
            "spread over its bundles (the paper uses 10)."
        )
    if config.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            "RiskPO scores a bundle by the weighted sum of its members' raw rewards, so "
            f"multi_objective_aggregation={config.multi_objective_aggregation!r} does not apply; leave it at "
            "'sum_then_normalize'."
        )


def _refuse_unsourced_combinations(config: Any) -> None:
    """Combinations neither the paper nor the authors' code uses, where the advantage's scale goes wrong (a baseline
    with the authors' scaling is refused where the choices are resolved)."""
    # An advantage scaling's entry names the quantile source it needs, if any, and why.
    scaling = ADVANTAGE_SCALINGS.about(config.advantage_scaling)
    if scaling.get("quantile_source", config.quantile_source) != config.quantile_source:
        raise ValueError(
            f"advantage_scaling={config.advantage_scaling!r} with quantile_source={config.quantile_source!r}: that "
            f"scaling {scaling['quantile_source_reason']}"
        )
    # A credit rule's entry names the advantage scaling it comes from, and whether another is refused or warned.
    credit = CREDIT_ASSIGNMENTS.about(config.credit_assignment)
    if credit.get("scaling", config.advantage_scaling) != config.advantage_scaling:
        message = f"credit_assignment={config.credit_assignment!r} {credit['reason']}"
        if credit["other_scaling"] != "warn":
            raise ValueError(message)
        warnings.warn(message, stacklevel=caller_stacklevel())


def _check_batch_layout(config: Any) -> None:
    """Prompts per generation batch must form whole bundle groups (an evaluation batch's last group may be
    partial); checkpoints should fall between generation batches."""
    problem = bundle_layout_error(config.generation_batch_size, config.num_generations, config.bundle_size)
    if problem is not None:
        raise ValueError(problem)
    generate_every = config.steps_per_generation * config.num_iterations
    off_boundary = _checkpoints_off_generation_boundaries(config, generate_every)
    if off_boundary:
        multiple = generate_every // math.gcd(generate_every, config.gradient_accumulation_steps)
        given = f"save_steps={config.save_steps:g}" + (
            f" (every {_save_interval(config)} optimizer steps of max_steps={config.max_steps})"
            if config.save_steps < 1
            else ""
        )
        warnings.warn(
            f"Checkpoints at {given} do not fall on generation batch boundaries (a new batch every "
            f"{generate_every} micro-steps: steps_per_generation x num_iterations; the first such checkpoint is "
            f"at step {off_boundary[0]}). TRL regenerates on resume, so a run resumed from such a checkpoint "
            "draws an extra batch and its quantiles and bundles diverge from an uninterrupted run's. Make "
            f"save_steps a multiple of {multiple} (with gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps}, the smallest interval whose checkpoints all fall between "
            "generation batches).",
            stacklevel=caller_stacklevel(),
        )


def _check_token_mean_groups(config: Any) -> None:
    """Groups of loss_token_mean_sequences must hold whole micro-batches and should tile each optimizer step; a
    step must not straddle two generation batches (the groups' token counts are taken per generation batch)."""
    size = config.loss_token_mean_sequences
    if size is None:
        return
    if config.loss_type != "bnpo":
        raise ValueError(
            f"loss_token_mean_sequences={size} regroups the token mean of loss_type='bnpo' (verl's token-mean); "
            f"loss_type={config.loss_type!r} aggregates otherwise. Set loss_type='bnpo' or drop the field."
        )
    if config.use_liger_kernel and compat.liger_skips_compute_loss():
        raise ValueError(
            f"use_liger_kernel=True with loss_token_mean_sequences={size}: with TRL "
            f"{compat.installed_version('trl')} the loss is Liger's, which never applies the token-mean factors, "
            "so the setting would be silently dropped. Set use_liger_kernel=False, drop loss_token_mean_sequences, "
            "or upgrade to TRL 1.16, where Liger supplies only layer kernels and the factors apply."
        )
    per_device = config.per_device_train_batch_size
    if size < 1 or size % per_device != 0:
        raise ValueError(
            f"loss_token_mean_sequences={size} must be a positive multiple of per_device_train_batch_size="
            f"{per_device}, so each group holds whole micro-batches: set per_device_train_batch_size to a "
            f"divisor of {size} ({divisors(size) if size >= 1 else 'none'})."
        )
    per_step = per_device * config.world_size * config.gradient_accumulation_steps
    if per_step % size != 0:
        warnings.warn(
            f"An optimizer step holds {per_step} sequences (per_device_train_batch_size={per_device} x "
            f"{config.world_size} processes x gradient_accumulation_steps={config.gradient_accumulation_steps}), "
            f"not a whole number of loss_token_mean_sequences={size} groups: its last group holds "
            f"{per_step % size} and weighs as much as a full one. Make the step a multiple of {size}: on "
            f"{config.world_size} process(es), gradient_accumulation_steps a multiple of "
            f"{size // math.gcd(size, per_device * config.world_size)} (a recipe written for more processes warns "
            "when run on fewer).",
            stacklevel=caller_stacklevel(),
        )
    if config.steps_per_generation % config.gradient_accumulation_steps != 0:
        raise ValueError(
            f"steps_per_generation={config.steps_per_generation} must be a multiple of gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps} with loss_token_mean_sequences: an optimizer step must not span "
            "two generation batches."
        )


def _save_interval(args: Any) -> int | None:
    """Optimizer steps between checkpoints, or None when not known at config time (no step-based saving, or a
    fraction of a max_steps that epochs decide)."""
    if args.save_strategy != "steps":
        return None
    if args.save_steps >= 1:
        return int(args.save_steps)
    return math.ceil(args.max_steps * args.save_steps) if args.max_steps > 0 else None


def _checkpoints_off_generation_boundaries(args: Any, generate_every: int) -> list[int]:
    """The optimizer steps at which a step-based checkpoint will be written in the middle of a generation batch,
    leaving out the one at the end of the run (the run is over there; continuing it is not a resume of this run).
    Saving every ``save_steps`` with no ``max_steps`` (epochs decide the end): the first off-boundary multiple."""
    every = _save_interval(args)
    if every is None:
        return []

    def off(step: int) -> bool:
        return (step * args.gradient_accumulation_steps) % generate_every != 0

    if args.max_steps > 0:
        return [step for step in range(every, args.max_steps, every) if off(step)]
    period = generate_every // math.gcd(generate_every, args.gradient_accumulation_steps)
    return [step for step in range(every, every * period + 1, every) if off(step)][:1]
