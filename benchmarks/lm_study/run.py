"""One RL run from an SFT start: the trainer of each method, the probes that record what the study measures, and the
cached result file (``runs/<method>-lr<lr>-seed<seed>.json``; written atomically, so a killed run leaves nothing)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import json_exists, read_json
from benchmarks.pipeline import write_json
from riskpo_trl.risk import frac_prompts_all_failed, push_signals

from .config import AUTHORS_FIELDS, METHODS, LMConfig
from .evaluation import evaluate, evaluate_tracked, selection_score
from .plans import best_rate, run_name
from .task import exact_match_reward, make_splits, prompt_of


class RewardRecorder:
    """The task's reward (``grader``, the text exact match unless given), keeping every training generation batch's
    rewards for the post hoc tail statistic."""

    __name__ = "exact_match_reward"

    def __init__(self, grader=exact_match_reward) -> None:
        self.grader = grader
        self.batches: list[list[float]] = []

    def __call__(self, completions, answer, **kwargs) -> list[float]:
        rewards = self.grader(completions, answer, **kwargs)
        self.batches.append(rewards)
        return rewards


def lower_tail_rvar(rewards: list[float], num_generations: int, bundle_size: int, alpha: float, seed: int) -> float:
    """Mean bundle score at or below the batch's empirical ``alpha``-quantile, bundles drawn by the project's
    ``permutation_bundles`` from a fixed seed: the same statistic for every method."""
    from riskpo_trl.risk import empirical_quantiles, permutation_bundles

    scores, _ = permutation_bundles(
        torch.tensor(rewards), num_generations, bundle_size, torch.Generator().manual_seed(seed)
    )
    q_alpha = empirical_quantiles(scores, [alpha])[0]
    return scores[scores <= q_alpha].mean().item()


def batch_signals(rewards: torch.Tensor, advantages: torch.Tensor, num_generations: int) -> dict[str, float | None]:
    """What a regime guard could watch on one training generation batch: the trainer's own
    :func:`~riskpo_trl.risk.push_signals` (shares pushed down and up, reward-advantage correlation, ``None`` when
    undefined) and the shares of prompts whose completions all failed or all succeeded."""
    signals = push_signals(advantages, rewards)
    grouped = rewards.double().view(-1, num_generations)
    return {
        "frac_negative_advantage": signals["frac_negative_advantage"],
        "frac_positive_advantage": signals["frac_positive_advantage"],
        "reward_advantage_corr": signals.get("reward_advantage_corr"),
        "frac_prompts_all_wrong": frac_prompts_all_failed(rewards, num_generations),  # the trainer's guard signal
        "frac_prompts_all_right": float((grouped.min(1).values >= 1).double().mean()),
    }


def known(value: float) -> float | None:
    """None for NaN: a curve's undefined point, as JSON can hold it."""
    return None if math.isnan(value) else value


def with_covariance_probe(trainer_cls):
    """``trainer_cls`` (RiskPO's trainer, or TRL's GRPOTrainer with the per-batch seam of
    ``riskpo_trl.trainer.observed.observed_trainer``) with a batch observer (the public per-batch hook,
    ``add_batch_observer``) that records, for each training generation batch, (a) the covariance and the correlation
    between a completion's length-normalised log-probability (under the policy that sampled it) and its advantage,
    within each prompt's group, averaged over prompts (Proposition 1's quantity), logged as ``probe/*``; (b) the
    :func:`batch_signals` and, for RiskPO, the quantiles used. Both are kept on the trainer (``probe_history``,
    ``batch_signal_history``), never in TRL's own logs. Everything else is inherited."""

    class CovarianceProbe(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.batch_signal_history: list[dict[str, float | None]] = []
            self.probe_history: list[dict[str, float | None]] = []
            self.add_batch_observer(self._probe)

        def _probe(self, scored) -> None:
            if scored.mode != "train":
                return
            output = scored.outputs
            old = output.get("old_per_token_logps")
            if old is not None:
                mask = output["completion_mask"].float()
                logp = (old * mask).sum(1) / mask.sum(1).clamp(min=1)
                adv = output["advantages"].float()
                g = self.num_generations
                lp, a = logp.view(-1, g), adv.view(-1, g)
                lp_c, a_c = lp - lp.mean(1, keepdim=True), a - a.mean(1, keepdim=True)
                cov = (lp_c * a_c).sum(1) / (g - 1)
                denom = (lp_c.pow(2).sum(1) * a_c.pow(2).sum(1)).sqrt()
                corr = torch.where(denom > 0, (lp_c * a_c).sum(1) / denom.clamp(min=1e-12), torch.zeros_like(denom))
                self.probe_history.append(
                    {"logprob_adv_cov": known(cov.mean().item()), "logprob_adv_corr": known(corr.mean().item())}
                )
            signals = batch_signals(
                scored.rewards.float().cpu(), output["advantages"].float().cpu(), self.num_generations
            )
            if scored.risk is not None:
                signals["q_alpha"] = float(torch.as_tensor(scored.risk.q_alpha).float().mean())
                signals["q_beta"] = float(torch.as_tensor(scored.risk.q_beta).float().mean())
            self.batch_signal_history.append(signals)

    CovarianceProbe.__name__ = f"Probed{trainer_cls.__name__}"
    return CovarianceProbe


def rl_config(method: str, lr: float, seed: int, cfg: LMConfig, output_dir: Path, **overrides: Any):
    """The trainer config of ``method``: identical batches, sampling and schedule for every method; ``overrides``
    change settings that do not touch the maths (e.g. activation checkpointing)."""
    from trl import GRPOConfig

    from riskpo_trl import RiskPOConfig

    completions = cfg.prompts_per_generation * cfg.num_generations
    common = {
        "output_dir": str(output_dir),
        "max_steps": cfg.generation_batches * cfg.updates_per_generation,
        "learning_rate": lr,
        "lr_scheduler_type": "constant",
        "num_generations": cfg.num_generations,
        "per_device_train_batch_size": completions // cfg.updates_per_generation,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": cfg.updates_per_generation,
        "max_completion_length": cfg.max_completion_length,
        "temperature": cfg.temperature,
        "top_k": 0,
        "top_p": 1.0,
        "beta": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "bf16": False,
        "use_cpu": True,
        "seed": seed,
        "log_completions": False,
        "disable_tqdm": True,
        **overrides,
    }
    if method == "grpo":
        return GRPOConfig(**common)
    if method == "gspo":
        return GRPOConfig(**common, importance_sampling_level="sequence", loss_type="grpo")
    risk = {"bundle_size": cfg.bundle_size, "advantage_baseline": "none"}  # the paper's advantage unless stated
    if method == "riskpo":
        return RiskPOConfig(**common, **risk)
    if method == "risk_seeking":
        return RiskPOConfig(**common, **risk, risk_profile="risk_seeking")
    if method == "riskpo_authors":
        return RiskPOConfig(**common, **risk, **AUTHORS_FIELDS)
    if method == "riskpo_loo":
        return RiskPOConfig(**common, **{**risk, "advantage_baseline": "loo"})
    raise ValueError(f"Unknown method {method!r}; choose one of {METHODS}.")


def build_trainer(
    method: str,
    lr: float,
    seed: int,
    cfg: LMConfig,
    start_dir: Path,
    output_dir: Path,
    train_buckets: tuple[int, ...] | None = None,
    grader_for=None,
    **overrides,
):
    """The probed trainer of ``method`` on the task's RL prompts (of ``train_buckets`` only, if given), from the SFT
    model in ``start_dir``; ``grader_for(tokenizer)`` gives the reward's grader (default: the text exact match)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from riskpo_trl import RiskPOTrainer
    from riskpo_trl.trainer.observed import observed_trainer
    from riskpo_trl.trainer.registry import get_trainer_classes

    splits = make_splits(cfg)
    train_rows = [
        {"prompt": prompt_of(a, b), "answer": str(a + b)}
        for d, pairs in splits.train.items()
        if train_buckets is None or d in train_buckets
        for a, b in pairs
    ]
    args = rl_config(method, lr, seed, cfg, output_dir, **overrides)
    grpo_trainer = observed_trainer(get_trainer_classes("grpo")[1])  # TRL's GRPOTrainer, its batches observed
    trainer_cls = with_covariance_probe(grpo_trainer if method in ("grpo", "gspo") else RiskPOTrainer)
    tokenizer = AutoTokenizer.from_pretrained(start_dir)
    recorder = RewardRecorder(grader_for(tokenizer)) if grader_for is not None else RewardRecorder()
    return trainer_cls(
        model=str(start_dir),
        reward_funcs=recorder,
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tokenizer,
    )


def training_curves(trainer, cfg: LMConfig, seed: int) -> dict[str, list]:
    """Per generation batch: mean reward and lower-tail RVaR of the rewards; per update: TRL's token entropy, the
    probe's covariance and correlation, the clipped share."""
    history = trainer.state.log_history
    recorder = trainer.reward_funcs[0]

    def curve(key: str) -> list[float]:
        return [entry[key] for entry in history if key in entry]

    return {
        "reward": [sum(b) / len(b) for b in recorder.batches],
        "lower_rvar": [
            lower_tail_rvar(b, cfg.num_generations, cfg.bundle_size, cfg.risk_alpha, seed=i)
            for i, b in enumerate(recorder.batches)
        ],
        "entropy": curve("entropy"),
        "logprob_adv_cov": [entry["logprob_adv_cov"] for entry in trainer.probe_history],
        "logprob_adv_corr": [entry["logprob_adv_corr"] for entry in trainer.probe_history],
        "clip_ratio": curve("clip_ratio/region_mean"),
    }


def train_timed(trainer) -> float:
    """Train; return the wall-clock seconds it took."""
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started


def load_summary(loads: list[float]) -> dict[str, float]:
    """The 1-minute load averages sampled along a run (the cores are shared, so each run records its load)."""
    return {"mean": sum(loads) / len(loads), "max": max(loads), "samples": len(loads)}


@dataclass
class BestWeights:
    """The weights with the best validation score so far, copied in memory, and the generation batch they are from."""

    score: float = -math.inf
    generation_batch: int | None = None
    state: dict[str, torch.Tensor] | None = None

    def offer(self, score: float, generation_batch: int, model) -> None:
        if score > self.score:
            self.score, self.generation_batch = score, generation_batch
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def earlier_than(self, final_batch: int) -> bool:
        """Whether the best weights are from a checkpoint before the last one (then they differ from the final)."""
        return self.state is not None and self.generation_batch != final_batch


def run_rl(method: str, lr: float, seed: int, cfg: LMConfig, out_dir: Path) -> dict[str, Any]:
    """One run of the short protocol from ``out_dir``'s SFT start; writes ``runs/<name>.json`` (curves, validation
    and test Pass@k)."""
    path = out_dir / "runs" / f"{run_name(method, lr, seed)}.json"
    if json_exists(path):
        return read_json(path)
    trainer = build_trainer(
        method, lr, seed, cfg, out_dir / "models" / "sft", out_dir / "models" / "rl" / run_name(method, lr, seed)
    )
    splits = make_splits(cfg)
    seconds = train_timed(trainer)
    tokenizer = trainer.processing_class
    result = {
        "method": method,
        "lr": lr,
        "seed": seed,
        "train_seconds": seconds,
        "curves": training_curves(trainer, cfg, seed),
        "val": evaluate(trainer.model, tokenizer, splits.val, cfg),
        "test": evaluate(trainer.model, tokenizer, splits.test, cfg),
    }
    result["selection_score"] = selection_score(result["val"], cfg)
    write_json(path, result)
    print(f"[rl] {run_name(method, lr, seed)}: {seconds:.0f}s, val score {result['selection_score']:.3f}", flush=True)
    return result


# --- the long protocol ----------------------------------------------------------------------------------------------


def long_selection_score(val: dict[str, Any]) -> float:
    """``LONG_SELECTION_CRITERION``: mean of validation Pass@1 and Pass@16 over all buckets (Pass@k with the largest
    k <= 16 measured, when fewer than 16 samples were drawn: the smoke sizes)."""
    return (val["all"]["pass@1"] + val["all"][selection_k(val)]) / 2


def selection_k(val: dict[str, Any]) -> str:
    """``"pass@16"``, or the largest measured ``pass@k`` below it (the smoke sizes draw fewer samples)."""
    ks = [int(key.split("@")[1]) for key in val["all"] if key.startswith("pass@")]
    return f"pass@{max(k for k in ks if k <= 16)}"


def tracked_eval(model, tokenizer, problems, cfg: LMConfig, num_samples: int, seed: int) -> dict[str, Any]:
    return evaluate_tracked(
        model,
        tokenizer,
        problems,
        num_samples=num_samples,
        ks=cfg.ks,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_completion_length,
        seed=seed,
    )


def evaluate_sft_start(cfg: LMConfig, start_dir: Path, track_samples: int) -> dict[str, Any]:
    """The start's row: validation as tracked along training, test as at the end of a run."""
    path = start_dir / "start_eval.json"
    if json_exists(path):
        return read_json(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = start_dir / "models" / "sft"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    splits = make_splits(cfg)
    result = {
        "val": tracked_eval(model, tokenizer, splits.val, cfg, track_samples, cfg.eval_seed),
        "test": tracked_eval(model, tokenizer, splits.test, cfg, cfg.eval_samples, cfg.eval_seed + 1),
    }
    write_json(path, result)
    return result


def run_long_rl(
    method: str,
    lr: float,
    seed: int,
    cfg: LMConfig,
    start_dir: Path,
    *,
    eval_every: int,
    track_samples: int,
    train_buckets: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """One run of the long protocol from ``start_dir``'s SFT model; writes ``start_dir/runs/<name>.json``.

    Every ``eval_every`` generation batches the validation split is evaluated (:func:`tracked_eval`, ``track_samples``
    samples per problem, entropy included) and the weights with the best :func:`long_selection_score` so far are
    kept in memory. At the end the test split is evaluated with ``cfg.eval_samples`` samples for the final weights
    and, when it was an earlier evaluation, for the best validation checkpoint too. Activation checkpointing is off
    (a speed setting: the tiny model needs no memory saving)."""
    path = start_dir / "runs" / f"{run_name(method, lr, seed)}.json"
    if json_exists(path):
        return read_json(path)
    from transformers import TrainerCallback

    trainer = build_trainer(
        method,
        lr,
        seed,
        cfg,
        start_dir / "models" / "sft",
        start_dir / "models" / "rl" / run_name(method, lr, seed),
        train_buckets=train_buckets,
        gradient_checkpointing=False,
    )
    tokenizer = trainer.processing_class
    splits = make_splits(cfg)
    tracked: list[dict[str, Any]] = []
    best = BestWeights()
    steps_between = eval_every * cfg.updates_per_generation
    loads = [os.getloadavg()[0]]  # 1-minute load average: the cores are shared, so each run records its load

    class TrackValidation(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % steps_between:
                return
            val = tracked_eval(model, tokenizer, splits.val, cfg, track_samples, cfg.eval_seed)
            batch = state.global_step // cfg.updates_per_generation
            score = long_selection_score(val)
            tracked.append({"generation_batch": batch, "update": state.global_step, "score": score, "val": val})
            loads.append(os.getloadavg()[0])
            best.offer(score, batch, model)
            print(
                f"[long] {run_name(method, lr, seed)} batch {batch}: val Pass@1 {val['all']['pass@1']:.3f}, "
                f"criterion {score:.3f}, entropy {val['all']['entropy']:.3f}",
                flush=True,
            )

    trainer.add_callback(TrackValidation())
    seconds = train_timed(trainer)
    final_batch = trainer.state.global_step // cfg.updates_per_generation
    result = {
        "method": method,
        "lr": lr,
        "seed": seed,
        "start": start_dir.name,
        "train_buckets": list(train_buckets) if train_buckets else None,
        "train_seconds": seconds,
        "load_average": load_summary(loads),
        "curves": training_curves(trainer, cfg, seed),
        "batch_signals": getattr(trainer, "batch_signal_history", []),
        "tracked": tracked,
        "selection_score": tracked[-1]["score"] if tracked else None,
        "test": tracked_eval(trainer.model, tokenizer, splits.test, cfg, cfg.eval_samples, cfg.eval_seed + 1),
        "best_val_generation_batch": best.generation_batch,
    }
    if best.earlier_than(final_batch):
        trainer.model.load_state_dict(best.state)
        result["best_val_test"] = tracked_eval(
            trainer.model, tokenizer, splits.test, cfg, cfg.eval_samples, cfg.eval_seed + 1
        )
    write_json(path, result)
    print(f"[long] {run_name(method, lr, seed)} from {start_dir.name}: {seconds / 60:.0f} min", flush=True)
    return result


def select_lrs(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, float]:
    """Per method, the grid lr with the best validation criterion; only for methods whose grid is complete."""
    chosen = {}
    for method in methods:
        paths = {lr: out_dir / "runs" / f"{run_name(method, lr, cfg.grid_seed)}.json" for lr in cfg.learning_rates}
        lr = best_rate({lr: read_json(p)["selection_score"] if json_exists(p) else None for lr, p in paths.items()})
        if lr is not None:
            chosen[method] = lr
    return chosen
