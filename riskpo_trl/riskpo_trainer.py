"""RiskPOTrainer: GRPO with bundled Mixed Value-at-Risk advantages."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import textwrap
import warnings
from typing import Any

import torch
from transformers.utils import logging
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from .console import silence_known_warnings
from .console_callback import use_compact_log
from .dataset_checks import check_dataset_columns, check_generation_batch_fits
from .estimator import RiskEstimator
from .model_card import save_model_card
from .model_paths import check_model_path
from .naming import closest_name
from .quantile_tracker import QuantileTracker
from .regime_guard import RegimeGuard
from .risk import RiskPOBatch
from .riskpo_config import RiskPOConfig
from .tied_weights import without_tied_missing_keys
from .token_mean_groups import token_mean_group_scales
from .unscored_rewards import UnscoredCounts, counting_unscored

RISK_STATE_FILE = "riskpo_state.json"
# Key of a training micro-batch's factor on its bnpo loss when loss_token_mean_sequences is set.
TOKEN_MEAN_SCALE = "token_mean_scale"

logger = logging.get_logger(__name__)

# Before any config or model is built: the warnings fire there.
silence_known_warnings()


class RegimeWarning(UserWarning):
    """The regime guard's warning: training sits where the paper's advantage was measured to collapse."""


class RiskPOTrainer(GRPOTrainer):
    """
    Trainer for Risk-based Policy Optimization (RiskPO).

    RiskPO (https://huggingface.co/papers/2510.00911) is a GRPO variant that optimises a risk measure of the reward
    distribution instead of its mean. What differs from [`~trl.GRPOTrainer`] is the advantage only, computed by one
    [`~riskpo_trl.estimator.RiskEstimator`] call per generation batch (gathered over all processes):

    1. the batch is cut into groups of ``bundle_size`` prompts; each prompt's completions are shuffled by an
       independent uniform permutation and matched into ``num_generations`` bundles whose summed reward is the bundle
       score;
    2. trackers of the ``risk_alpha`` / ``risk_beta`` quantiles of bundle scores take one stochastic-approximation
       step on the batch (never on evaluation batches);
    3. every completion gets its bundle's MVaR advantage (or the ``risk_profile`` chosen), computed with the
       quantiles after that step, and each process keeps its own slice.

    This class only connects that step to TRL: it captures the gathered rewards, seeds the bundling identically on
    every rank (and after a resume), slices the advantages, logs, and saves/restores the estimator's state.

    The loss is inherited unchanged: with the config's defaults (``importance_sampling_level="sequence"``,
    ``loss_type="grpo"``) TRL's `_compute_loss` is exactly the paper's clipped objective (eq. ``mvar_obj``), the
    clipped ``min(s * A, clip(s, 1 - eps, 1 + eps) * A)`` with ``s = (pi / pi_old) ** (1 / |y|)``, averaged over
    sequences; `tests/test_loss.py` checks this against a direct implementation. With ``loss_type="bnpo"`` and
    ``loss_token_mean_sequences`` set, each micro-batch's loss is multiplied by a factor that makes the optimizer
    step's loss verl's token mean over groups of that many sequences (`riskpo_trl.token_mean_groups`), what the
    authors' runs used. The trackers are saved in every checkpoint (``riskpo_state.json``) and restored on resume.
    Per generation batch the trainer logs ``risk/q_alpha``, ``risk/q_beta``, ``risk/bundle_score_mean``,
    ``risk/mvar``, ``risk/lower_rvar``, ``risk/frac_zero_advantage``, ``risk/frac_unscorable`` and a few more next to
    GRPO's metrics, and the completions table shows RiskPO's advantages and each completion's bundle.

    Unscorable completions (every reward function returned ``None`` or NaN) get advantage 0 and do not count in their
    bundle's score, which is rescaled to the size of a full bundle; see [`permutation_bundles`]. A warning names the
    reward functions that returned NaN, and how often.

    At construction, besides GRPOTrainer's own checks: a model path that does not exist, a misspelled keyword, the
    columns TRL and the reward functions read, and a training set smaller than one generation batch (which would train
    0 steps) are refused with a message that names them; `train` raises if a run ends without a single step.
    """

    _tag_names = ["trl", "riskpo"]
    _name = "RiskPO"
    _paper = {
        "title": "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training",
        "id": "2510.00911",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{ren2025riskpo,
                title        = {{RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training}},
                author       = {Tao Ren and Jinyang Jiang and Hui Yang and Wan Tian and Minhao Zou and Guanghao Li and Zishi Zhang and Qinghao Wang and Shentao Qin and Yanjun Zhao and Rui Tao and Hui Shao and Yijie Peng},
                year         = 2025,
                eprint       = {2510.00911},
                archivePrefix = {arXiv},
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: RiskPOConfig | None = None, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = RiskPOConfig(f"{model_name.split('/')[-1]}-RiskPO")
        elif not isinstance(args, RiskPOConfig):
            raise TypeError(
                f"RiskPOTrainer needs a RiskPOConfig, got {type(args).__name__}. Convert it with "
                "RiskPOConfig.from_grpo_config(your_config, bundle_size=..., ...): it keeps every setting and adds "
                "the risk fields you pass."
            )
        _check_keywords(kwargs)
        train_dataset = kwargs.get("train_dataset")
        check_dataset_columns(train_dataset, kwargs.get("eval_dataset"), reward_funcs,
                              kwargs.get("environment_factory"))
        check_generation_batch_fits(train_dataset, args)
        if isinstance(model, str):
            check_model_path(model)
        super().__init__(model, reward_funcs, args=args, **kwargs)
        use_compact_log(self)
        self.risk_estimator = RiskEstimator.from_config(args)
        # The guard's evidence is about the paper's advantage; the authors' scaling did not collapse in its regime.
        patience = args.regime_guard_patience if args.advantage_scaling == "none" else 0
        self.regime_guard = RegimeGuard(args.regime_guard_threshold, patience)
        self._unscorable_batches = 0  # consecutive training batches without a scorable completion
        self._eval_batches = 0
        self._last_rewards_per_func: torch.Tensor | None = None
        self._last_unscored: UnscoredCounts | None = None
        self.last_risk_batch: RiskPOBatch | None = None  # the latest batch's bundles, for inspection and tests
        self._scaled_buffer: list | None = None  # the generation batch the loss scales below belong to
        self._token_mean_scales: torch.Tensor | None = None

    def train(self, *args, **kwargs):
        """`Trainer.train`, but a run that ends without a single optimizer step raises instead of returning as if it
        had trained (e.g. an ``IterableDataset`` that yields fewer examples than one generation batch)."""
        output = super().train(*args, **kwargs)
        if self.state.global_step == 0:
            prompts = self.args.generation_batch_size // self.num_generations
            raise RuntimeError(
                f"Training ended without a single step: the training data yielded fewer than the {prompts} prompts "
                f"one generation batch takes (generation_batch_size={self.args.generation_batch_size} / "
                f"num_generations={self.num_generations}). Add examples, or lower steps_per_generation, "
                "per_device_train_batch_size or the number of processes."
            )
        return output

    @property
    def quantile_tracker(self) -> QuantileTracker:
        """The quantile trackers (owned by ``risk_estimator``)."""
        return self.risk_estimator.tracker

    # --- advantages --------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # The rewards come back gathered over all processes; keep them for the bundling.
        with counting_unscored(self, list(self.reward_func_names)) as unscored:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        self._last_unscored = unscored
        start = self.accelerator.process_index * len(prompts)
        self._warn_unscored(unscored, rewards_per_func[start : start + len(prompts)], completions)
        return rewards_per_func

    def _warn_unscored(self, unscored: UnscoredCounts, local_rewards: torch.Tensor, completions: list) -> None:
        """Name NaN rewards as NaN (TRL reports them as None), and the completions no reward function scored."""
        total = len(completions)
        for name, nan in zip(unscored.names, unscored.nan):
            if nan:
                logger.warning(
                    f"Reward function {name} returned NaN for {nan} of {total} completions. NaN, like None, leaves a "
                    "completion unscored by that function; if NaN is not meant as 'does not apply', fix the function "
                    "(return None for that)."
                )
        unscorable = torch.isnan(local_rewards).all(dim=1)
        if unscorable.any():
            first = completions[int(unscorable.nonzero()[0, 0])]
            logger.warning(
                f"{int(unscorable.sum())} of {total} completions were scored by no reward function ("
                f"{unscored.describe()}); they get advantage 0. First of them: {str(first)[:200]!r}"
            )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        rewards_per_func = self._last_rewards_per_func
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable: no reward function answered

        batch = self.risk_estimator.step(
            rewards.float().cpu(),
            generator=torch.Generator().manual_seed(self._bundling_seed(mode)),
            train=mode == "train",
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
        )
        local_count = output["advantages"].shape[0]
        start = self.accelerator.process_index * local_count
        output["advantages"] = batch.advantages[start : start + local_count].to(output["advantages"].device)

        self._replace_logged_advantages(batch)
        metrics = self.risk_estimator.metrics(batch)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        self.last_risk_batch = batch
        if mode == "train":
            self._stop_if_nothing_is_scorable(batch)
            warning = self.regime_guard.observe(metrics)
            if warning and self.accelerator.is_main_process:
                warnings.warn(warning, RegimeWarning, stacklevel=2)
        return output

    def _stop_if_nothing_is_scorable(self, batch: RiskPOBatch) -> None:
        """A batch in which every reward function returned None or NaN for every completion trains on nothing (all
        advantages 0); a few in a row mean the rewards cannot read this data, so stop rather than train silently."""
        self._unscorable_batches = self._unscorable_batches + 1 if bool(batch.unscorable.all()) else 0
        limit = self.args.max_unscorable_batches
        if limit and self._unscorable_batches >= limit:
            counts = self._last_unscored.describe() if self._last_unscored else ""
            raise RuntimeError(
                f"No completion could be scored in the last {self._unscorable_batches} training batches: no reward "
                f"function ({', '.join(self.reward_func_names)}) scored any completion (last batch on this process: "
                f"{counts}), so every advantage was 0. None means a function does not apply; NaN is usually a bug in "
                "the function. Check that the reward functions fit the dataset (e.g. the format of the "
                "reference-answer column they read) and the completions (e.g. max_completion_length long enough to "
                "reach an answer). Set max_unscorable_batches=0 to keep training anyway."
            )

    def _bundling_seed(self, mode: str) -> int:
        """Same on every rank and after a resume: derived from the seed, the step and the batch counter only."""
        if mode == "train":
            counter = self.quantile_tracker.num_updates
        else:
            counter, self._eval_batches = self._eval_batches, self._eval_batches + 1
        key = f"riskpo-bundles/{self.args.seed}/{mode}/{self.state.global_step}/{counter}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)

    def _replace_logged_advantages(self, batch: RiskPOBatch) -> None:
        """GRPOTrainer logged its own advantages for the completions table; show RiskPO's and the bundles instead."""
        count = batch.advantages.numel()
        logged = self._logs["advantages"]
        for _ in range(min(count, len(logged))):
            logged.pop()
        logged.extend(batch.advantages.tolist())
        self._logs["extra"]["bundle"].extend(batch.bundle_ids.tolist())
        self._logs["extra"]["bundle_score"].extend(batch.bundle_scores[batch.bundle_ids].tolist())

    # --- loss granularity --------------------------------------------------------------------------------------------

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        inputs = super()._prepare_inputs(generation_batch)
        if not self.model.training or self.args.loss_token_mean_sequences is None:
            return inputs
        if self._buffered_inputs is not self._scaled_buffer:  # a new generation batch: one gather for all its steps
            self._scaled_buffer = self._buffered_inputs
            self._token_mean_scales = self._gathered_token_mean_scales(self._buffered_inputs)
        index = self._step % self.args.steps_per_generation
        return {**inputs, TOKEN_MEAN_SCALE: self._token_mean_scales[index]}

    def _gathered_token_mean_scales(self, micro_batches: list[dict[str, Any]]) -> torch.Tensor:
        """This process's loss factor for each micro-batch of the generation batch (`token_mean_groups`)."""
        counts = torch.stack([self._loss_mask(batch).sum() for batch in micro_batches]).float()
        gathered = self.accelerator.gather(counts).reshape(self.accelerator.num_processes, -1).cpu()
        scales = token_mean_group_scales(
            gathered,
            self.args.gradient_accumulation_steps,
            self.args.loss_token_mean_sequences // self.args.per_device_train_batch_size,
        )
        return scales[self.accelerator.process_index].to(counts.device, torch.float32)

    @staticmethod
    def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
        """The tokens TRL's loss averages over (its `_compute_loss` mask)."""
        mask = batch["completion_mask"]
        return mask if "tool_mask" not in batch else mask * batch["tool_mask"]

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        scale = inputs.get(TOKEN_MEAN_SCALE)
        return loss if scale is None else loss * scale

    # --- model card ----------------------------------------------------------------------------------------------

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | list[str] | None = None,
        tags: str | list[str] | None = None,
        dataset_files: list[str] | None = None,
    ) -> None:
        """The card of `riskpo_trl.model_card`: the run's own name, the base model only when it is a Hub id, the Hub
        datasets given (``dataset_files`` for local ones) and the risk settings."""
        save_model_card(self, model_name=model_name, datasets=dataset_name, dataset_files=dataset_files, tags=tags)

    # --- checkpointing -------------------------------------------------------------------------------------------

    def _save_optimizer_and_scheduler(self, output_dir):
        # This runs inside every checkpoint save, before the trainer state is written and the folder is pushed to the
        # Hub, so a checkpoint that exists (locally or pushed) always carries the trackers.
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            state = {**self.risk_estimator.state_dict(), "regime_guard": self.regime_guard.state_dict()}
            path = os.path.join(output_dir, RISK_STATE_FILE)
            with open(path + ".tmp", "w") as f:
                json.dump(state, f, indent=2)
            os.replace(path + ".tmp", path)  # atomic: a kill mid-write leaves no half-written file

    def _issue_warnings_after_load(self, load_result) -> None:
        # A checkpoint stores a tied weight once (lm_head.weight shares the embedding's tensor), so loading it reports
        # the tied copy as missing although it holds the loaded values; only real gaps are worth a warning.
        super()._issue_warnings_after_load(without_tied_missing_keys(self.model, load_result))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, RISK_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{checkpoint} has no {RISK_STATE_FILE}, so the quantile trackers cannot be restored. Resume from a "
                "checkpoint written by RiskPOTrainer, or start a fresh run."
            )
        with open(path) as f:
            state = json.load(f)
        self.risk_estimator.load_state_dict(state)
        if "regime_guard" in state:  # checkpoints written before the guard existed have none
            self.regime_guard.load_state_dict(state["regime_guard"])


def _check_keywords(kwargs: dict[str, Any]) -> None:
    """A misspelled keyword is named with the closest one GRPOTrainer takes, before anything loads."""
    accepted = set(inspect.signature(GRPOTrainer.__init__).parameters) - {"self", "model", "reward_funcs", "args"}
    for name in kwargs:
        if name not in accepted:
            raise TypeError(
                f"RiskPOTrainer got an unexpected keyword argument {name!r}{closest_name(name, accepted)}; it takes "
                f"GRPOTrainer's: model, reward_funcs, args, {', '.join(sorted(accepted))}."
            )
