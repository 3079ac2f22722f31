"""Configuration of the RiskPO trainer."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import os
import sys
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import transformers
import trl
from transformers.utils import logging as transformers_logging

from .. import compat

compat.check_versions()  # before TRL loads: a release outside the tested range gets one message naming the range

from transformers.utils import is_torch_bf16_gpu_available  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from ..registry import closest_name  # noqa: E402
from ..risk import (  # noqa: E402
    ADVANTAGE_BASELINES, ADVANTAGE_SCALINGS, BUNDLINGS, CREDIT_ASSIGNMENTS, QUANTILE_SOURCES, RISK_PROFILES,
    scaled_advantage,
)
from ..risk.advantages import levels_in_order  # noqa: E402
from ..risk.baselines import check_baseline_pair  # noqa: E402

logger = transformers_logging.get_logger(__name__)

# The paper updates 4 times per generation batch (batch 512 prompts, mini-batches of 128).
UPDATES_PER_GENERATION = 4


@dataclass
class RiskPOConfig(GRPOConfig):
    r"""
    Configuration for [`RiskPOTrainer`]: everything [`~trl.GRPOConfig`] has, plus the risk measure.

    RiskPO (https://huggingface.co/papers/2510.00911) replaces GRPO's group-normalised advantage by the advantage of a
    Mixed Value-at-Risk objective computed on *bundles*: ``bundle_size`` prompts' completions are randomly matched into
    ``num_generations`` bundles whose summed reward is the unit of reward, and the ``risk_alpha`` / ``risk_beta``
    quantiles of the bundle scores are tracked online.

    Parameters that differ from [`~trl.GRPOConfig`], set to the paper's values:
        num_generations (`int`, defaults to `10`), temperature (`float`, defaults to `0.8`), epsilon (`float`,
        defaults to `0.2`), beta (`float`, defaults to `0.0`, no KL term), importance_sampling_level (`str`, defaults
        to `"sequence"`), loss_type (`str`, defaults to `"grpo"`): together the paper's sequence-level clipped ratio
        averaged over sequences (eq. `mvar_obj`).
        per_device_train_batch_size (`int`, defaults to `10`) and gradient_accumulation_steps (`int`, defaults to
        `5`): one generation batch holds `5 x num_processes` prompts, a whole number of bundle groups on any number of
        processes. per_device_eval_batch_size (`int`, defaults to `50`): likewise for evaluation.
        bf16 (`bool`, defaults to `True` where a bf16-capable accelerator is present or `use_cpu` is set, else
        `False`), so the default config also runs on a CPU-only machine.

    Parameters of the risk measure:
        risk_alpha (`float`, defaults to `0.2`), risk_beta (`float`, defaults to `0.8`), risk_omega (`float`, defaults
        to `0.5`), bundle_size (`int`, defaults to `5`), risk_profile (`str`, defaults to `"mvar"`), quantile_source
        (`str`, defaults to `"tracked"`), advantage_scaling (`str`, defaults to `"none"`), natural_baseline (`bool`,
        defaults to `True`), credit_assignment (`str`, defaults to `"uniform"`), bundling (`str`, defaults to
        `"permutation"`), advantage_baseline (`str`, defaults to `"none"`: the paper), quantile_lr (`float`, defaults
        to `0.1`), quantile_lr_decay (`float`, defaults to `0.0`), max_unscorable_batches (`int`, defaults to `3`),
        regime_guard_threshold (`float`, defaults to `0.5`), regime_guard_patience (`int`, defaults to `0`: the guard
        is off): see each field's help. The non-default advantage choices reproduce the authors' public code (see
        `docs/algorithm.md`), except advantage_baseline: `"loo"` subtracts from each completion's advantage the mean
        advantage of its prompt's other completions, which makes the advantages two-signed; it keeps the expected
        gradient at fixed quantiles because that mean does not depend on the completion itself.
        steps_per_generation (`int`, defaults to `4 x gradient_accumulation_steps` unless it or generation_batch_size
        is set): the paper's 4 optimizer updates per generation batch.
        loss_token_mean_sequences (`int`, defaults to `None`): with loss_type `"bnpo"`, the token mean over groups of
        this many sequences instead of over each micro-batch, as verl's (the authors' code; see
        `riskpo_trl.trainer.token_mean`).
    """

    # Risk measure
    risk_alpha: float = field(
        default=0.2,
        metadata={"help": "Lower quantile level alpha: bundles scoring at or below the alpha-quantile form the lower "
                  "tail that gets the extra (1 + risk_omega) weight. Needs 0 <= risk_alpha < risk_beta."},
    )
    risk_beta: float = field(
        default=0.8,
        metadata={"help": "Upper quantile level beta: bundles scoring above the beta-quantile get zero advantage "
                  "(mvar) or the extra weight (risk_seeking). Needs risk_alpha < risk_beta <= 1."},
    )
    risk_omega: float = field(
        default=0.5,
        metadata={"help": "Mixing weight omega >= 0 of MVaR: the lower tail is weighted by (1 + omega). 0 reduces "
                  "MVaR to CVaR at level risk_beta."},
    )
    bundle_size: int = field(
        default=5,
        metadata={"help": "Prompts per bundle B: each prompt's completions are randomly permuted and matched "
                  "one-to-one with those of the other B - 1 prompts of its group; a bundle's score is the sum of its "
                  "members' rewards. 1 disables bundling. Prompts per generation batch must be a multiple of it."},
    )
    risk_profile: str = field(
        default="mvar",
        metadata={"help": f"Risk measure to optimise: {RISK_PROFILES.describe()}.", "choices": list(RISK_PROFILES)},
    )
    quantile_source: str = field(
        default="tracked",
        metadata={"help": f"Quantile source: where the advantage's quantiles come from: {QUANTILE_SOURCES.describe()}. "
                  "The trackers run and are logged in every case.", "choices": list(QUANTILE_SOURCES)},
    )
    advantage_scaling: str = field(
        default="none",
        metadata={"help": "Advantage scaling: how the risk profile's advantage is computed: "
                  f"{ADVANTAGE_SCALINGS.describe()}.", "choices": list(ADVANTAGE_SCALINGS)},
    )
    natural_baseline: bool = field(
        default=True,
        metadata={"help": "Natural baseline: keep the constant q_alpha - q_beta of the window g(R, q_alpha, q_beta) "
                  "(the paper). False drops it, as the authors' DAPO script (natural_baseline_adv=False): most "
                  "advantages become positive."},
    )
    credit_assignment: str = field(
        default="uniform",
        metadata={"help": "Credit assignment: how a bundle's advantage reaches its members: "
                  f"{CREDIT_ASSIGNMENTS.describe()}.", "choices": list(CREDIT_ASSIGNMENTS)},
    )
    advantage_baseline: str = field(
        default="none",
        metadata={"help": "Advantage baseline: what is subtracted from each completion's advantage after credit "
                  f"assignment: {ADVANTAGE_BASELINES.describe()}. A baseline that does not depend on the completion "
                  "itself leaves the expected policy gradient unchanged and only changes which completions are pushed "
                  "up or down. Not with advantage_scaling='authors_code'.",
                  "choices": list(ADVANTAGE_BASELINES)},
    )
    bundling: str = field(
        default="permutation",
        metadata={"help": f"Bundling: how completions are matched into bundles: {BUNDLINGS.describe()}.",
                  "choices": list(BUNDLINGS)},
    )
    max_unscorable_batches: int = field(
        default=3,
        metadata={"help": "Unscorable batches before stopping: stop with an error after this many consecutive "
                  "training batches in which no completion could be scored (every reward function returned None): "
                  "such a run trains on nothing. 0 never stops. The share of unscorable completions is logged as "
                  "risk/frac_unscorable."},
    )
    regime_guard_threshold: float = field(
        default=0.5,
        metadata={"help": "Regime guard threshold (the guard is opt-in: see regime_guard_patience): the share of a "
                  "training batch's prompts with no completion rewarded above 0 (risk/frac_prompts_all_failed) at or "
                  "above which a batch counts toward the guard. In (0, 1]."},
    )
    regime_guard_patience: int = field(
        default=0,
        metadata={"help": "Regime guard patience (opt-in; 0, the default, turns it off): warn once after this many "
                  "consecutive training batches at or past regime_guard_threshold. Post hoc and narrow: the signal was "
                  "chosen after the runs of one tiny-LM study (a 0.5M-parameter model, 20 x 8 batches, Adam at lr 3e-5 "
                  "to 1e-4), where it marked the regime in which the paper's advantage lost most of its coverage (at "
                  "GRPO's learning rate, and in later runs at a 3x smaller one) but fired on many healthy runs and did "
                  "not predict which runs collapsed "
                  "(docs/replication.md, 'The regime guard'). Only with advantage_scaling='none'. The "
                  "metric is logged either way."},
    )
    quantile_lr: float = field(
        default=0.1,
        metadata={"help": "Quantile tracker step: step size gamma of the quantile trackers, in units of the bundle "
                  "score. The first batch warm-starts the trackers at its empirical quantiles."},
    )
    quantile_lr_decay: float = field(
        default=0.0,
        metadata={"help": "Quantile tracker step decay: exponent p of the tracker step, gamma_k = quantile_lr / k**p. "
                  "0 keeps it constant (the authors' code); a value in (0.5, 1] gives the classic decreasing "
                  "stochastic-approximation steps."},
    )

    # GRPOConfig fields whose defaults follow the paper or fit the bundling
    num_generations: int | None = field(
        default=10,
        metadata={"help": "Completions per prompt G (the paper uses 10). Each prompt contributes one completion to "
                  "each of its group's G bundles."},
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (the paper uses 0.8)."})
    epsilon: float = field(default=0.2, metadata={"help": "Clipping range of the sequence-level importance ratio."})
    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient. 0.0 (the paper) drops the KL term and does not load a reference model."},
    )
    importance_sampling_level: str = field(
        default="sequence",
        metadata={"help": "'sequence' (the paper, as GSPO): one length-normalised ratio (pi/pi_old)^(1/|y|) per "
                  "completion; 'token': one ratio per token."},
    )
    loss_type: str = field(
        default="grpo",
        metadata={"help": "Loss aggregation. 'grpo' (the paper) averages each sequence's loss, then over sequences; "
                  "other TRL loss types ('dapo', 'dr_grpo', 'bnpo', ...) are available for ablations."},
    )
    loss_token_mean_sequences: int | None = field(
        default=None,
        metadata={"help": "Token-mean group size: with loss_type='bnpo', take the token mean over groups of this many "
                  "sequences of an optimizer step, then the mean over groups (verl's token-mean over a micro-batch of "
                  "ppo_micro_batch_size_per_gpu sequences), whatever per_device_train_batch_size is. It must be a "
                  "multiple of per_device_train_batch_size and should divide the sequences of an optimizer step. "
                  "None: TRL's bnpo, one token mean per micro-batch."},
    )
    per_device_train_batch_size: int = field(
        default=10,
        metadata={"help": "Completions per device per micro-batch. With the default gradient_accumulation_steps=5 a "
                  "generation batch holds 5 x num_processes prompts of 10 completions."},
    )
    gradient_accumulation_steps: int = field(
        default=5,
        metadata={"help": "Micro-batches accumulated per optimizer step (one mini-batch)."},
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={"help": "Micro-steps per generation batch. If neither it nor generation_batch_size is set: "
                  f"{UPDATES_PER_GENERATION} x gradient_accumulation_steps, the paper's {UPDATES_PER_GENERATION} "
                  "optimizer updates per generation batch (batch 512, mini-batch 128), so the clipped ratio acts."},
    )
    per_device_eval_batch_size: int = field(
        default=50,
        metadata={"help": "Completions per device per evaluation batch. Evaluation bundles like training; a batch "
                  "whose prompts are not a multiple of bundle_size gets a smaller last group."},
    )
    bf16: bool | None = field(
        default=None,
        metadata={"help": "Whether to use bf16 mixed precision. If not set: True where a bf16-capable accelerator is "
                  "present (or use_cpu is set) and fp16 is off, else False."},
    )

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig, **risk_fields) -> RiskPOConfig:
        """A RiskPOConfig with every setting of ``grpo_config`` (tokens included) plus ``risk_fields``.

        GRPO's own values carry over where they differ from the paper's defaults (e.g. ``num_generations=8``, one
        generation batch per optimizer step), so pass ``bundle_size`` and any other field to change as
        ``risk_fields``; see `converted_config_kwargs` for the generation batch. One warning names the carried-over
        settings that differ from the paper's (`settings_off_the_papers`).
        """
        config = cls(**converted_config_kwargs(grpo_config, cls, risk_fields))
        kept = settings_off_the_papers(config, cls, chosen=set(risk_fields))
        if kept:
            logger.warning(
                f"{cls.__name__}.from_grpo_config kept the GRPO config's {', '.join(kept)}; pass any of them to "
                "from_grpo_config to use the paper's."
            )
        return config

    def __post_init__(self):
        if self.bf16 is None:
            self.bf16 = not self.fp16 and (self.use_cpu or is_torch_bf16_gpu_available())
        if self.ddp_backend is None and _deepspeed_launch_without_accelerator():
            # Without a backend, transformers sets up a single-process state under a CPU-only DeepSpeed launch while
            # DeepSpeed itself sees every rank, so batch sizes disagree. gloo gives both the real world size.
            self.ddp_backend = "gloo"
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = UPDATES_PER_GENERATION * self.gradient_accumulation_steps
        self._validate_risk_fields()
        self._refuse_unsourced_combinations()
        super().__post_init__()
        self._validate_batch_layout()
        self._validate_token_mean_groups()

    def _validate_risk_fields(self) -> None:
        if not levels_in_order(self.risk_alpha, self.risk_beta):
            raise ValueError(
                f"risk_alpha={self.risk_alpha} and risk_beta={self.risk_beta} must satisfy 0 <= risk_alpha < "
                "risk_beta <= 1 (the paper uses risk_alpha=0.2, risk_beta=0.8)."
            )
        if self.risk_omega < 0:
            raise ValueError(
                f"risk_omega={self.risk_omega} must be >= 0: it is the extra weight on the lower tail (the paper uses "
                "0.5; 0 gives CVaR)."
            )
        if self.bundle_size < 1:
            raise ValueError(f"bundle_size={self.bundle_size} must be >= 1 (1 disables bundling; the paper uses 5).")
        RISK_PROFILES.check(self.risk_profile)
        QUANTILE_SOURCES.check(self.quantile_source)
        ADVANTAGE_SCALINGS.check(self.advantage_scaling)
        CREDIT_ASSIGNMENTS.check(self.credit_assignment)
        BUNDLINGS.check(self.bundling)
        ADVANTAGE_BASELINES.check(self.advantage_baseline)
        variant = scaled_advantage(self.advantage_scaling, self.risk_profile)
        if not variant.levels_ok(self.risk_alpha, self.risk_beta):
            raise ValueError(
                f"advantage_scaling={self.advantage_scaling!r} with risk_profile={self.risk_profile!r} needs "
                f"{variant.levels_rule}; got risk_alpha={self.risk_alpha}, risk_beta={self.risk_beta}."
            )
        if not self.natural_baseline and not variant.has_natural_baseline:
            raise ValueError(
                f"natural_baseline=False changes nothing for risk_profile={self.risk_profile!r} with "
                f"advantage_scaling={self.advantage_scaling!r}: that advantage has no q_alpha - q_beta constant (its "
                "excluded lower tail already gets 0). Leave natural_baseline at True."
            )
        if self.max_unscorable_batches < 0:
            raise ValueError(
                f"max_unscorable_batches={self.max_unscorable_batches} must be >= 0 (0 never stops the run)."
            )
        if not 0 < self.regime_guard_threshold <= 1:
            raise ValueError(
                f"regime_guard_threshold={self.regime_guard_threshold} is a share of prompts (those with no completion rewarded "
                "above 0): it must be in (0, 1]."
            )
        if self.regime_guard_patience < 0:
            raise ValueError(
                f"regime_guard_patience={self.regime_guard_patience} must be >= 0 (0 disables the regime guard)."
            )
        if self.quantile_lr <= 0:
            raise ValueError(f"quantile_lr={self.quantile_lr} must be > 0 (the authors' code uses 0.1).")
        if self.quantile_lr_decay < 0:
            raise ValueError(f"quantile_lr_decay={self.quantile_lr_decay} must be >= 0 (0 keeps the step constant).")
        if self.num_generations is None or self.num_generations < 2:
            raise ValueError(
                f"num_generations={self.num_generations} must be >= 2: each prompt needs several completions to "
                "spread over its bundles (the paper uses 10)."
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "RiskPO scores a bundle by the weighted sum of its members' raw rewards, so "
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} does not apply; leave it at "
                "'sum_then_normalize'."
            )

    def _refuse_unsourced_combinations(self) -> None:
        """Combinations neither the paper nor the authors' code uses, where the advantage's scale goes wrong."""
        check_baseline_pair(self.advantage_baseline, self.advantage_scaling)
        if self.advantage_scaling == "authors_code" and self.quantile_source != "group":
            raise ValueError(
                f"advantage_scaling='authors_code' with quantile_source={self.quantile_source!r}: that scaling "
                "divides by each bundle group's score std, which is only on a sensible scale with the group's own "
                "quantiles (with shared quantiles the failures of a group with one success get 2-3 times the "
                "advantage of an all-zero group). Set quantile_source='group' (what the authors' code effectively "
                "does), or advantage_scaling='none' for the paper's advantage."
            )
        if self.credit_assignment in ("std", "sum_mean") and self.advantage_scaling != "authors_code":
            raise ValueError(
                f"credit_assignment={self.credit_assignment!r} rescales members by their prompt's reward statistics, "
                "which only the authors' scaling uses (their scripts: advantage_scaling='authors_code', "
                "quantile_source='group'); with the paper's advantage it multiplies some prompts' advantages several "
                "fold. Set advantage_scaling='authors_code' and quantile_source='group', or credit_assignment="
                "'uniform' (the paper)."
            )
        if self.credit_assignment == "score" and self.advantage_scaling != "authors_code":
            warnings.warn(
                "credit_assignment='score' (x0.5 for rewarded members, x1.5 otherwise) comes from the authors' code "
                "and none of their scripts uses it; with the paper's advantage it is an untested mix.",
                stacklevel=_caller_stacklevel(),
            )

    def _validate_batch_layout(self) -> None:
        """Prompts per generation batch must form whole bundle groups (an evaluation batch's last group may be
        partial); checkpoints should fall between generation batches."""
        prompts = self.generation_batch_size // self.num_generations
        if prompts % self.bundle_size != 0:
            raise ValueError(
                f"A generation batch holds {prompts} prompts (generation_batch_size={self.generation_batch_size} / "
                f"num_generations={self.num_generations}), which is not a multiple of bundle_size={self.bundle_size}. "
                f"Make generation_batch_size a multiple of num_generations * bundle_size = "
                f"{self.num_generations * self.bundle_size} ({_multiples(self.num_generations * self.bundle_size)}), "
                "e.g. through per_device_train_batch_size x num_processes x steps_per_generation, or choose a "
                f"bundle_size that divides {prompts} ({_divisors(prompts)})."
            )
        generate_every = self.steps_per_generation * self.num_iterations
        off_boundary = _checkpoints_off_generation_boundaries(self, generate_every)
        if off_boundary:
            multiple = generate_every // math.gcd(generate_every, self.gradient_accumulation_steps)
            given = f"save_steps={self.save_steps:g}" + (
                f" (every {_save_interval(self)} optimizer steps of max_steps={self.max_steps})"
                if self.save_steps < 1 else "")
            warnings.warn(
                f"Checkpoints at {given} do not fall on generation batch boundaries (a new batch every "
                f"{generate_every} micro-steps: steps_per_generation x num_iterations; the first such checkpoint is "
                f"at step {off_boundary[0]}). TRL regenerates on resume, so a run resumed from such a checkpoint "
                "draws an extra batch and its quantiles and bundles diverge from an uninterrupted run's. Make "
                f"save_steps a multiple of {multiple} (with gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}, the smallest interval whose checkpoints all fall between "
                "generation batches).",
                stacklevel=_caller_stacklevel(),
            )

    def _validate_token_mean_groups(self) -> None:
        """Groups of loss_token_mean_sequences must hold whole micro-batches and should tile each optimizer step; a
        step must not straddle two generation batches (the groups' token counts are taken per generation batch)."""
        size = self.loss_token_mean_sequences
        if size is None:
            return
        if self.loss_type != "bnpo":
            raise ValueError(
                f"loss_token_mean_sequences={size} regroups the token mean of loss_type='bnpo' (verl's token-mean); "
                f"loss_type={self.loss_type!r} aggregates otherwise. Set loss_type='bnpo' or drop the field."
            )
        if self.use_liger_kernel and compat.liger_skips_compute_loss():
            raise ValueError(
                f"use_liger_kernel=True with loss_token_mean_sequences={size}: with TRL "
                f"{compat.installed_version('trl')} the loss is Liger's, which never applies the token-mean factors, "
                "so the setting would be silently dropped. Set use_liger_kernel=False, drop loss_token_mean_sequences, "
                "or upgrade to TRL 1.16, where Liger supplies only layer kernels and the factors apply."
            )
        per_device = self.per_device_train_batch_size
        if size < 1 or size % per_device != 0:
            raise ValueError(
                f"loss_token_mean_sequences={size} must be a positive multiple of per_device_train_batch_size="
                f"{per_device}, so each group holds whole micro-batches: set per_device_train_batch_size to a "
                f"divisor of {size} ({_divisors(size) if size >= 1 else 'none'})."
            )
        per_step = per_device * self.world_size * self.gradient_accumulation_steps
        if per_step % size != 0:
            warnings.warn(
                f"An optimizer step holds {per_step} sequences (per_device_train_batch_size={per_device} x "
                f"{self.world_size} processes x gradient_accumulation_steps={self.gradient_accumulation_steps}), "
                f"not a whole number of loss_token_mean_sequences={size} groups: its last group holds "
                f"{per_step % size} and weighs as much as a full one. Make the step a multiple of {size}: on "
                f"{self.world_size} process(es), gradient_accumulation_steps a multiple of "
                f"{size // math.gcd(size, per_device * self.world_size)} (a recipe written for more processes warns "
                "when run on fewer).",
                stacklevel=_caller_stacklevel(),
            )
        if self.steps_per_generation % self.gradient_accumulation_steps != 0:
            raise ValueError(
                f"steps_per_generation={self.steps_per_generation} must be a multiple of gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps} with loss_token_mean_sequences: an optimizer step must not span "
                "two generation batches."
            )


def _save_interval(args: GRPOConfig) -> int | None:
    """Optimizer steps between checkpoints, or None when not known at config time (no step-based saving, or a
    fraction of a max_steps that epochs decide)."""
    if args.save_strategy != "steps":
        return None
    if args.save_steps >= 1:
        return int(args.save_steps)
    return math.ceil(args.max_steps * args.save_steps) if args.max_steps > 0 else None


def _checkpoints_off_generation_boundaries(args: GRPOConfig, generate_every: int) -> list[int]:
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


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning raised while a config is built to the code that built it: the
    user's ``RiskPOConfig(...)`` line (or the script that parsed a recipe), not the dataclass's generated
    ``__init__`` (``<string>``), this module or transformers' and TRL's argument handling."""
    skipped = (os.path.abspath(__file__), os.path.abspath(dataclasses.__file__))
    library_dirs = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                         for module in (transformers, trl))
    frame = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None:
        filename = frame.f_code.co_filename
        if not (filename == "<string>" or os.path.abspath(filename) in skipped
                or os.path.abspath(filename).startswith(library_dirs)):
            break
        frame = frame.f_back
        level += 1
    return level


def _name_misspelled_fields(config_class: type) -> None:
    """Make ``config_class(bundel_size=2)`` say which field was meant, instead of the dataclass's bare 'unexpected
    keyword argument'."""
    generated_init = config_class.__init__

    @functools.wraps(generated_init)
    def __init__(self, *args, **kwargs):
        accepted = {f.name for f in fields(config_class) if f.init}
        for name in kwargs:
            if name not in accepted:
                raise TypeError(
                    f"{config_class.__name__} got an unexpected keyword argument {name!r}"
                    f"{closest_name(name, accepted)}."
                )
        generated_init(self, *args, **kwargs)

    config_class.__init__ = __init__


_name_misspelled_fields(RiskPOConfig)


def _deepspeed_launch_without_accelerator() -> bool:
    launched = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and "LOCAL_RANK" in os.environ
    return launched and not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available())


def _multiples(step: int, count: int = 3) -> str:
    return ", ".join(str(step * k) for k in range(1, count + 1)) + ", ..."


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


# --- carrying a built GRPOConfig over to another config class (RiskPOConfig.from_grpo_config)

# Deprecated fields that GRPOConfig copies into their replacement in __post_init__; passing both again would only
# repeat the deprecation warning.
_DEPRECATED_ALIASES = {
    "vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max",
    "use_transformers_paged": "use_transformers_continuous_batching",
}


def init_field_names(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class) if f.init}


# GRPO settings that define the paper's method, whose RiskPOConfig defaults are the paper's.
PAPER_GRPO_SETTINGS = ("importance_sampling_level", "loss_type", "temperature", "num_generations", "epsilon", "beta")


def settings_off_the_papers(config: GRPOConfig, config_class: type, chosen: set[str]) -> list[str]:
    """``"loss_type='dapo' (paper: 'grpo')"``, ... for each of :data:`PAPER_GRPO_SETTINGS` (and the optimizer updates
    per generation batch) where ``config`` differs from ``config_class``'s default, leaving out the fields in
    ``chosen`` (set on purpose)."""
    defaults = {f.name: f.default for f in fields(config_class)}
    differing = [f"{name}={getattr(config, name)!r} (paper: {defaults[name]!r})" for name in PAPER_GRPO_SETTINGS
                 if name not in chosen and getattr(config, name) != defaults[name]]
    updates = config.steps_per_generation / config.gradient_accumulation_steps
    if not chosen & {"steps_per_generation", "generation_batch_size"} and updates != UPDATES_PER_GENERATION:
        differing.append(f"{updates:g} optimizer update(s) per generation batch (steps_per_generation="
                         f"{config.steps_per_generation}; paper: {UPDATES_PER_GENERATION})")
    return differing


def converted_config_kwargs(source: Any, target_class: type, overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments that rebuild ``source`` (a built TrainingArguments/GRPOConfig) as ``target_class``.

    Values are read from the attributes, not from ``to_dict()``, which masks tokens (``hub_token``) and flattens
    nested configs. Of the pair ``generation_batch_size`` / ``steps_per_generation``, which GRPOConfig derives from each
    other and refuses both of, ``steps_per_generation`` carries over, so the source's generation schedule stays (GRPO's
    default is one generation batch per optimizer step, not RiskPOConfig's four); with the source's default relation
    (``steps_per_generation == gradient_accumulation_steps``) a new ``gradient_accumulation_steps`` moves it along.
    ``overrides`` win over the source's values; naming either field of the pair replaces both.
    """
    target_fields = init_field_names(target_class)
    unknown = sorted(set(overrides) - target_fields)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(target_fields), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(f"{target_class.__name__} has no field {', '.join(hints)}.")

    kwargs = {
        name: copy.deepcopy(getattr(source, name))
        for name in init_field_names(type(source)) & target_fields
        if hasattr(source, name)
    }
    for old, new in _DEPRECATED_ALIASES.items():
        if old in kwargs and new in kwargs and kwargs[old] is not None and kwargs[old] == kwargs[new]:
            kwargs.pop(old)
    kwargs.pop("generation_batch_size", None)
    if {"generation_batch_size", "steps_per_generation"} & set(overrides):
        kwargs.pop("steps_per_generation", None)
    elif "gradient_accumulation_steps" in overrides and kwargs.get("steps_per_generation") == getattr(
        source, "gradient_accumulation_steps", None
    ):
        kwargs["steps_per_generation"] = overrides["gradient_accumulation_steps"]
    kwargs.update(overrides)
    return kwargs
