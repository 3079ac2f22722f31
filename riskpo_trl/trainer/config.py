"""Configuration of the RiskPO trainer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .. import compat

compat.check_versions()  # before TRL loads: a release outside the tested range gets one message naming the range

from transformers.utils import is_torch_bf16_gpu_available  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from ..risk import (  # noqa: E402
    ADVANTAGE_BASELINES,
    ADVANTAGE_SCALINGS,
    BUNDLINGS,
    CREDIT_ASSIGNMENTS,
    QUANTILE_SOURCES,
    RISK_PROFILES,
)
from ..risk.choices import DEFAULT_CHOICES  # noqa: E402
from .caller_warnings import config_default_warnings_silenced  # noqa: E402
from .config_checks import check_config, json_object  # noqa: E402
from .config_conversion import documented_fields, from_grpo_config, name_misspelled_fields  # noqa: E402

# The paper updates 4 times per generation batch (batch 512 prompts, mini-batches of 128).
UPDATES_PER_GENERATION = 4
# Completions printed on the console per logging step (log_completions): a sample, not TRL's whole batch.
COMPLETIONS_PRINTED = 4


@name_misspelled_fields
@dataclass
class RiskPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`RiskPOTrainer`].

    [`RiskPOConfig`] inherits every parameter of [`~trl.GRPOConfig`] and adds the risk measure. RiskPO
    (https://huggingface.co/papers/2510.00911) replaces GRPO's group-normalised advantage by the advantage of a Mixed
    Value-at-Risk objective computed on *bundles*: `bundle_size` prompts' completions are randomly matched into
    `num_generations` bundles whose summed reward is the unit of reward, and the `risk_alpha` / `risk_beta` quantiles
    of the bundle scores are tracked online. Every default is the paper's except `advantage_baseline`, which left unset
    trains with `"loo"` (`"none"` is the paper exactly). The parameters below are documented by each field's `help`,
    the text `riskpo-train --help` shows (`DOCUMENTED_FIELDS`).

    Parameters:
    """

    # Risk measure
    risk_alpha: float = field(
        default=0.2,
        metadata={
            "help": "Lower quantile level alpha: bundles scoring at or below the alpha-quantile form the lower "
            "tail that gets the extra (1 + risk_omega) weight. Needs 0 <= risk_alpha < risk_beta."
        },
    )
    risk_beta: float = field(
        default=0.8,
        metadata={
            "help": "Upper quantile level beta: bundles scoring above the beta-quantile get zero advantage "
            "(mvar) or the extra weight (risk_seeking). Needs risk_alpha < risk_beta <= 1."
        },
    )
    risk_omega: float = field(
        default=0.5,
        metadata={
            "help": "Mixing weight omega >= 0 of MVaR: the lower tail is weighted by (1 + omega). 0 reduces "
            "MVaR to CVaR at level risk_beta."
        },
    )
    bundle_size: int = field(
        default=5,
        metadata={
            "help": "Prompts per bundle B: each prompt's completions are randomly permuted and matched "
            "one-to-one with those of the other B - 1 prompts of its group; a bundle's score is the sum of its "
            "members' rewards. 1 disables bundling. Prompts per generation batch must be a multiple of it."
        },
    )
    risk_profile: str = field(
        default=DEFAULT_CHOICES.risk_profile,
        metadata={"help": "Risk measure to optimise: %(choices)s.", "choices": RISK_PROFILES},
    )
    risk_profile_parameters: dict | str | None = field(
        default=None,
        metadata={
            "help": "The risk profile's own hyperparameters by name, for a profile that declares some (a JSON object "
            "on the command line, e.g. '{\"eta\": 2.0}'); those left out take the profile's defaults. The built-in "
            "profiles have none."
        },
    )
    quantile_source: str = field(
        default=DEFAULT_CHOICES.quantile_source,
        metadata={
            "help": "Quantile source: where the advantage's quantiles come from: %(choices)s. The trackers run "
            "and are logged in every case.",
            "choices": QUANTILE_SOURCES,
        },
    )
    advantage_scaling: str = field(
        default=DEFAULT_CHOICES.advantage_scaling,
        metadata={
            "help": "Advantage scaling: how the risk profile's advantage is computed: %(choices)s.",
            "choices": ADVANTAGE_SCALINGS,
        },
    )
    natural_baseline: bool = field(
        default=DEFAULT_CHOICES.natural_baseline,
        metadata={
            "help": "Natural baseline: keep the constant q_alpha - q_beta of the window g(R, q_alpha, q_beta) "
            "(the paper). False drops it, as the authors' DAPO script (natural_baseline_adv=False): most "
            "advantages become positive."
        },
    )
    credit_assignment: str = field(
        default=DEFAULT_CHOICES.credit_assignment,
        metadata={
            "help": "Credit assignment: how a bundle's advantage reaches its members: %(choices)s.",
            "choices": CREDIT_ASSIGNMENTS,
        },
    )
    advantage_baseline: str | None = field(
        default=DEFAULT_CHOICES.advantage_baseline,
        metadata={
            "help": "Advantage baseline: what is subtracted from each completion's advantage after credit "
            "assignment: %(choices)s. A baseline that does not depend on the completion "
            "itself leaves the expected policy gradient unchanged and only changes which completions are pushed "
            "up or down. Unset: 'loo', or 'none' (the authors' code) with advantage_scaling='authors_code', "
            "which refuses a baseline. 'none' is the paper exactly.",
            "choices": ADVANTAGE_BASELINES,
        },
    )
    bundling: str = field(
        default=DEFAULT_CHOICES.bundling,
        metadata={"help": "Bundling: how completions are matched into bundles: %(choices)s.", "choices": BUNDLINGS},
    )
    max_unscorable_batches: int = field(
        default=3,
        metadata={
            "help": "Unscorable batches before stopping: stop with an error after this many consecutive "
            "training batches in which no completion could be scored (every reward function returned None): "
            "such a run trains on nothing. 0 never stops. The share of unscorable completions is logged as "
            "risk/frac_unscorable."
        },
    )
    regime_guard_threshold: float = field(
        default=0.5,
        metadata={
            "help": "Regime guard threshold (the guard is opt-in: see regime_guard_patience): the share of a "
            "training batch's prompts with no completion rewarded above 0 (risk/frac_prompts_all_failed) at or "
            "above which a batch counts toward the guard. In (0, 1]."
        },
    )
    regime_guard_patience: int = field(
        default=0,
        metadata={
            "help": "Regime guard patience (opt-in; 0, the default, turns it off): warn once after this many "
            "consecutive training batches at or past regime_guard_threshold. Post hoc and narrow: the signal "
            "was chosen after the runs of one tiny-LM study (a 0.5M-parameter model, 20 x 8 batches, Adam at lr "
            "3e-5 to 1e-4), where it marked the regime in which the paper's advantage lost most of its coverage "
            "(at GRPO's learning rate, and in later runs at a 3x smaller one) but fired on many healthy runs and "
            "did not predict which runs collapsed "
            "(docs/replication.md, 'The regime guard'). Only with advantage_scaling='none'. The "
            "metric is logged either way."
        },
    )
    quantile_lr: float = field(
        default=0.1,
        metadata={
            "help": "Quantile tracker step: step size gamma of the quantile trackers, in units of the bundle "
            "score. The first batch warm-starts the trackers at its empirical quantiles."
        },
    )
    quantile_lr_decay: float = field(
        default=0.0,
        metadata={
            "help": "Quantile tracker step decay: exponent p of the tracker step, gamma_k = quantile_lr / k**p. "
            "0 keeps it constant (the authors' code); a value in (0.5, 1] gives the classic decreasing "
            "stochastic-approximation steps."
        },
    )

    # GRPOConfig fields whose defaults follow the paper or fit the bundling
    num_generations: int | None = field(
        default=10,
        metadata={
            "help": "Completions per prompt G (the paper uses 10). Each prompt contributes one completion to "
            "each of its group's G bundles."
        },
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (the paper uses 0.8)."})
    epsilon: float = field(default=0.2, metadata={"help": "Clipping range of the sequence-level importance ratio."})
    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient. 0.0 (the paper) drops the KL term and does not load a reference model."},
    )
    importance_sampling_level: str = field(
        default="sequence",
        metadata={
            "help": "'sequence' (the paper, as GSPO): one length-normalised ratio (pi/pi_old)^(1/|y|) per "
            "completion; 'token': one ratio per token."
        },
    )
    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "Loss aggregation. 'grpo' (the paper) averages each sequence's loss, then over sequences; "
            "other TRL loss types ('dapo', 'dr_grpo', 'bnpo', ...) are available for ablations."
        },
    )
    loss_token_mean_sequences: int | None = field(
        default=None,
        metadata={
            "help": "Token-mean group size: with loss_type='bnpo', take the token mean over groups of this many "
            "sequences of an optimizer step, then the mean over groups (verl's token-mean over a micro-batch of "
            "ppo_micro_batch_size_per_gpu sequences), whatever per_device_train_batch_size is. It must be a "
            "multiple of per_device_train_batch_size and should divide the sequences of an optimizer step. "
            "None: TRL's bnpo, one token mean per micro-batch."
        },
    )
    per_device_train_batch_size: int = field(
        default=10,
        metadata={
            "help": "Completions per device per micro-batch. With the default gradient_accumulation_steps=5 a "
            "generation batch holds 5 x num_processes prompts of 10 completions."
        },
    )
    gradient_accumulation_steps: int = field(
        default=5,
        metadata={"help": "Micro-batches accumulated per optimizer step (one mini-batch)."},
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Micro-steps per generation batch. If neither it nor generation_batch_size is set: "
            f"{UPDATES_PER_GENERATION} x gradient_accumulation_steps, the paper's {UPDATES_PER_GENERATION} "
            "optimizer updates per generation batch (batch 512, mini-batch 128), so the clipped ratio acts."
        },
    )
    num_completions_to_print: int | None = field(
        default=COMPLETIONS_PRINTED,
        metadata={
            "help": "Completions printed on the console per logging step when log_completions is set (TRL's "
            "default, None, prints the whole generation batch: thousands of long completions in the paper's "
            "layout); None prints them all."
        },
    )
    per_device_eval_batch_size: int = field(
        default=50,
        metadata={
            "help": "Completions per device per evaluation batch. Evaluation bundles like training; a batch "
            "whose prompts are not a multiple of bundle_size gets a smaller last group."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Whether to use bf16 mixed precision. If not set: True where a bf16-capable accelerator is "
            "present (or use_cpu is set) and fp16 is off, else False."
        },
    )

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig, **risk_fields) -> RiskPOConfig:
        """A RiskPOConfig with every setting of ``grpo_config`` (tokens included) plus ``risk_fields``.

        GRPO's own values carry over where they differ from the paper's defaults (e.g. ``num_generations=8``, one
        generation batch per optimizer step), so pass ``bundle_size`` and any other field to change as
        ``risk_fields``; see `converted_config_kwargs` for the generation batch. One warning names the carried-over
        settings that differ from the paper's (`settings_off_the_papers`; both in `config_conversion`).
        """
        return from_grpo_config(cls, grpo_config, risk_fields, UPDATES_PER_GENERATION)

    def __post_init__(self):
        if self.bf16 is None:
            self.bf16 = not self.fp16 and (self.use_cpu or is_torch_bf16_gpu_available())
        if self.ddp_backend is None and _deepspeed_launch_without_accelerator():
            # Without a backend, transformers sets up a single-process state under a CPU-only DeepSpeed launch while
            # DeepSpeed itself sees every rank, so batch sizes disagree. gloo gives both the real world size.
            self.ddp_backend = "gloo"
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = UPDATES_PER_GENERATION * self.gradient_accumulation_steps
        # text from the command line parsed; none set (an empty object too) is None, so a resume compares them alike
        self.risk_profile_parameters = json_object("risk_profile_parameters", self.risk_profile_parameters) or None
        with config_default_warnings_silenced(self):  # GRPOConfig's own gradient_checkpointing default
            check_config(self, super().__post_init__)


# The docstring's Parameters: the fields RiskPOConfig adds or whose defaults it changes, by section, each documented
# by its own `help` (one text for the API docs and the command line).
DOCUMENTED_FIELDS = {
    "Parameters of the risk measure": "risk_alpha risk_beta risk_omega risk_profile risk_profile_parameters",
    "Parameters that control bundling": "bundle_size bundling credit_assignment",
    "Parameters that control the quantiles": "quantile_source quantile_lr quantile_lr_decay",
    "Opt-ins: the authors' public code, and a baseline (see `docs/algorithm.md`)": "advantage_scaling "
    "natural_baseline advantage_baseline loss_token_mean_sequences",
    "Safety switches": "max_unscorable_batches regime_guard_threshold regime_guard_patience",
    "Parameters of [`~trl.GRPOConfig`] whose defaults are the paper's": "num_generations temperature epsilon beta "
    "importance_sampling_level loss_type per_device_train_batch_size gradient_accumulation_steps steps_per_generation "
    "per_device_eval_batch_size num_completions_to_print bf16",
}
RiskPOConfig.__doc__ = RiskPOConfig.__doc__.rstrip(" ") + documented_fields(
    RiskPOConfig, DOCUMENTED_FIELDS, "riskpo_trl.risk"
)


def _deepspeed_launch_without_accelerator() -> bool:
    launched = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and "LOCAL_RANK" in os.environ
    return launched and not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available())
