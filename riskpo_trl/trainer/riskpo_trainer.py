"""RiskPOTrainer: GRPO with bundled Mixed Value-at-Risk advantages."""

from __future__ import annotations

import hashlib
import logging
import textwrap

import torch

from .. import compat

compat.check_versions()  # before TRL loads: a release outside the tested range gets one message naming the range

from trl import GRPOTrainer  # noqa: E402

from ..risk import QuantileTracker, RiskEstimator  # noqa: E402
from .batch_hook import BatchObserversMixin, ScoredBatch  # noqa: E402
from .caller_warnings import warn_replaced_grpo_defaults  # noqa: E402
from .checkpoints import (  # noqa: E402
    RISK_STATE_FILE,
    check_resume_settings,
    max_training_batches,
    read_state,
    restore_state,
    resumed_baseline,
    risk_settings,
    write_state,
)
from .config import RiskPOConfig  # noqa: E402
from .regime_guard import RegimeGuard  # noqa: E402
from .token_mean import TokenMeanLossMixin  # noqa: E402

logger = logging.getLogger(__name__)


__all__ = ["RISK_STATE_FILE", "RiskPOTrainer"]


class RiskPOTrainer(BatchObserversMixin, TokenMeanLossMixin, GRPOTrainer):
    """
    Trainer for RiskPO (Risk-based Policy Optimization): GRPO whose advantage is bundled MVaR, not group-normalised.

    RiskPO (https://huggingface.co/papers/2510.00911) is a GRPO variant that optimises a risk measure of the reward
    distribution instead of its mean. What differs from [`~trl.GRPOTrainer`] is the advantage: one
    [`~riskpo_trl.risk.RiskEstimator`] call per generation batch (gathered over all processes):

    1. the batch is cut into groups of ``bundle_size`` prompts; each prompt's completions are shuffled by an
       independent uniform permutation and matched into ``num_generations`` bundles whose summed reward is the bundle
       score;
    2. trackers of the ``risk_alpha`` / ``risk_beta`` quantiles of bundle scores take one stochastic-approximation
       step on the batch (never on evaluation batches);
    3. every completion gets its bundle's MVaR advantage (or the ``risk_profile`` chosen), computed with the
       quantiles after that step, minus the ``advantage_baseline`` (by default each prompt's leave-one-out mean;
       ``"none"``, the paper, subtracts nothing), and each process keeps its own slice.

    The trackers are saved in every checkpoint (``riskpo_state.json``) and restored on resume. Per generation batch the
    trainer logs ``risk/q_alpha``, ``risk/q_beta``, ``risk/bundle_score_mean``, the profile's objective
    (``risk/mvar`` for MVaR), ``risk/lower_rvar``, ``risk/frac_zero_advantage``, ``risk/frac_unscorable`` and a few
    more next to GRPO's metrics, and the completions table shows RiskPO's advantages and each completion's bundle.
    Each batch then reaches the observers added with ``add_batch_observer`` (a
    [`~riskpo_trl.trainer.batch_hook.ScoredBatch`]); the regime guard is one.

    The loss is GRPOTrainer's: with the config's defaults (``importance_sampling_level="sequence"``,
    ``loss_type="grpo"``) TRL's `_compute_loss` is exactly the paper's clipped objective (eq. ``mvar_obj``), the
    clipped ``min(s * A, clip(s, 1 - eps, 1 + eps) * A)`` with ``s = (pi / pi_old) ** (1 / |y|)``, averaged over
    sequences; `tests/test_loss.py` checks this against a direct implementation. With ``loss_type="bnpo"`` and
    ``loss_token_mean_sequences`` set, each micro-batch's loss is rescaled to verl's token mean over groups of that
    many sequences, what the authors' runs used ([`~riskpo_trl.trainer.token_mean.TokenMeanLossMixin`]).

    Unscorable completions (every reward function returned ``None`` or NaN) get advantage 0 and do not count in their
    bundle's score, which is rescaled to the size of a full bundle; see [`~riskpo_trl.risk.permutation_bundles`].

    Every other difference from [`~trl.GRPOTrainer`] is in `docs/architecture.md` ("What RiskPO changes"). The guard
    rails of a training job (start-up checks, reward accounting, checkpoint guards, the vLLM server's weight sync,
    stopping on a signal, the run lock, the model card) come from [`riskpo_trl.job`], applied to any trainer.
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

    config_class = RiskPOConfig

    def __init__(self, model, reward_funcs=None, args: RiskPOConfig | None = None, **kwargs):
        if args is not None and not isinstance(args, RiskPOConfig):
            raise TypeError(
                f"RiskPOTrainer needs a RiskPOConfig, got {type(args).__name__}. Convert it with "
                "RiskPOConfig.from_grpo_config(your_config, bundle_size=..., ...): it keeps every setting and adds "
                "the risk fields you pass."
            )
        if args is None:  # as GRPOTrainer's default, with RiskPO's config
            args = RiskPOConfig(f"{_model_name(model).split('/')[-1]}-{self._name}")
        else:  # a renamed GRPO script hears which of GRPO's defaults the paper's layout replaced
            warn_replaced_grpo_defaults(args, logger)
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self.risk_estimator = RiskEstimator.from_config(args)
        # The guard's evidence is about the paper's advantage; the authors' scaling did not collapse in its regime.
        patience = args.regime_guard_patience if args.advantage_scaling == "none" else 0
        self.regime_guard = RegimeGuard(args.regime_guard_threshold, patience)
        self.add_batch_observer(self.regime_guard.observe_batch)
        self._unscorable_batches = 0  # consecutive training batches without a scorable completion
        self._eval_batches = 0

    @property
    def quantile_tracker(self) -> QuantileTracker:
        """The quantile trackers (owned by ``risk_estimator``)."""
        return self.risk_estimator.tracker

    # --- the advantage step --------------------------------------------------------------------------------------

    def _score_batch(self, batch: ScoredBatch) -> None:
        rewards = batch.rewards  # weighted sum per completion, NaN where no reward function answered
        train = batch.mode == "train"
        risk = self.risk_estimator.step(
            rewards.float().cpu(),
            generator=torch.Generator().manual_seed(self._bundling_seed(batch.mode)),
            train=train,
            num_generations=self.num_generations if train else self.num_generations_eval,
        )
        local = batch.outputs["advantages"]  # GRPO's, this process's slice
        start = self.accelerator.process_index * local.shape[0]
        batch.outputs["advantages"] = risk.advantages[start : start + local.shape[0]].to(local.device)

        self._replace_logged_advantages(risk, local.tolist(), start)
        batch.risk, batch.metrics = risk, self.risk_estimator.metrics(risk)
        for name, value in batch.metrics.items():
            self._metrics[batch.mode][name].append(value)
        if train:
            self._stop_if_nothing_is_scorable(risk)

    def _stop_if_nothing_is_scorable(self, batch) -> None:
        """A batch in which every reward function returned None or NaN for every completion trains on nothing (all
        advantages 0); a few in a row mean the rewards cannot read this data, so stop rather than train silently."""
        self._unscorable_batches = self._unscorable_batches + 1 if bool(batch.unscorable.all()) else 0
        limit = self.args.max_unscorable_batches
        if limit and self._unscorable_batches >= limit:
            counts = getattr(self, "unscored_counts", None)  # the job layer's reward accounting, when applied
            why = (
                counts.why_nothing_scored(self.reward_funcs) if counts else "no reward function scored any completion"
            )
            raise RuntimeError(
                f"No completion could be scored in the last {self._unscorable_batches} training batches: {why}. Set "
                "max_unscorable_batches=0 to keep training anyway."
            )

    def _bundling_seed(self, mode: str) -> int:
        """Same on every rank and after a resume: derived from the seed, the step and the batch counter only."""
        if mode == "train":
            counter = self.quantile_tracker.num_updates
        else:
            counter, self._eval_batches = self._eval_batches, self._eval_batches + 1
        key = f"riskpo-bundles/{self.args.seed}/{mode}/{self.state.global_step}/{counter}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)

    def _replace_logged_advantages(self, batch, grpo_local: list[float], start: int) -> None:
        """GRPOTrainer logged its own advantages for the completions table; show RiskPO's and the bundles instead.
        ``grpo_local``: GRPO's advantages of this process, from ``start`` on, which the table's last entries hold."""
        count = batch.advantages.numel()
        logged = self._logs["advantages"]
        compat.check_logged_advantages(logged, count, grpo_local, start)
        for _ in range(min(count, len(logged))):
            logged.pop()
        logged.extend(batch.advantages.tolist())
        self._logs["extra"]["bundle"].extend(batch.bundle_ids.tolist())
        self._logs["extra"]["bundle_score"].extend(batch.bundle_scores[batch.bundle_ids].tolist())

    # --- its saved state -----------------------------------------------------------------------------------------

    def _save_optimizer_and_scheduler(self, output_dir):
        # This runs inside every checkpoint save, before the trainer state is written and the folder is pushed to the
        # Hub, so a checkpoint that exists (locally or pushed) always carries the trackers.
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            state = {
                **self.risk_estimator.state_dict(),
                "regime_guard": self.regime_guard.state_dict(),
                "settings": risk_settings(self.args),
            }
            write_state(output_dir, state)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        check_resume_settings(checkpoint, self.args)
        state = read_state(checkpoint)
        max_batches = max_training_batches(checkpoint, self.args.gradient_accumulation_steps)
        restore_state(checkpoint, state, self.risk_estimator, self.regime_guard, max_batches)
        baseline = resumed_baseline(state, self.args)
        current = self.risk_estimator.choices.advantage_baseline  # resolved
        if baseline is not None and baseline != current:
            logger.warning(
                "Resuming from %s, written before checkpoints recorded their risk settings: it was trained "
                "with advantage_baseline=%r (the paper's advantage), so this run goes on with it, not with "
                "the default %r. Set advantage_baseline to choose.",
                checkpoint,
                baseline,
                current,
            )
            self.args.advantage_baseline = baseline
            self.risk_estimator.rechoose(advantage_baseline=baseline)
        # Printed, not logged at INFO (hidden by default): docs/training.md promises the line on every resume.
        self.accelerator.print(
            f"Resumed from {checkpoint} with advantage_baseline={self.risk_estimator.choices.advantage_baseline!r}."
        )


def _model_name(model) -> str:
    from trl.trainer.utils import get_config_model_id

    return model if isinstance(model, str) else get_config_model_id(model.config)
