"""Tiny-LM study: GRPO, GSPO, RiskPO, RiskPO with the authors' DAPO advantage and risk-seeking on a task with a hard
tail, each method tuned fairly, at identical compute (CPU, about an hour on 2 busy cores).

One command runs everything, resumable (every run is cached as JSON; a rerun skips finished runs)::

    python -m benchmarks.lm_study                 # SFT start, lr grid, selection, test seeds, report
    python -m benchmarks.lm_study --smoke         # trivial size for the test suite; numbers mean nothing
    python -m benchmarks.lm_study --report-only   # tables and figures from whatever runs have finished

The task: ``a+b=`` with both operands of ``d`` digits, ``d`` in {2, 3, 4} (the difficulty buckets), reward 1 iff the
completion is exactly the sum. A tiny Qwen2 (character tokenizer, built locally) is fine-tuned on the task with TRL's
``SFTTrainer`` until the easy bucket is mostly solved while the hardest is not (the stopping rule is in
:class:`LMConfig`); that one SFT model is the start of every RL run.

The protocol, fixed in :class:`LMConfig` before any RL run (only the SFT budget was calibrated before, on the SFT
start alone, and is recorded in ``sft_summary.json``):

- identical compute for every method: the same generation batches (``prompts_per_generation`` prompts x
  ``num_generations`` completions, temperature 0.8), split into 4 mini-batches, one Adam update each (the paper's
  4 updates per generation batch), the same number of generation batches, the same seeds;
- methods: ``grpo`` = TRL's ``GRPOTrainer`` with its own defaults for the loss (token-level ratio,
  ``loss_type="dapo"``, group-scaled advantage); ``gspo`` = ``GRPOTrainer`` with
  ``importance_sampling_level="sequence"`` and ``loss_type="grpo"``, the loss RiskPO uses, so GSPO vs RiskPO
  isolates the advantage; ``riskpo`` = ``RiskPOTrainer`` with the paper's defaults; ``riskpo_authors`` = the
  authors' DAPO-script advantage (runs only once ``RiskPOConfig`` has the issue-10 fields, else reported as not
  run); ``risk_seeking`` = ``risk_profile="risk_seeking"``;
- fair tuning: every method trains at every learning rate of ``learning_rates`` with ``grid_seed``; the learning rate
  is chosen per method on the validation split by ``SELECTION_CRITERION`` (mean of validation Pass@1 and Pass@16);
  the chosen learning rate is then run with every seed of ``test_seeds`` (the grid run is reused for ``grid_seed``)
  and reported on the test split as mean +- std;
- measured along training: mean reward, token entropy (TRL's), the lower-tail RVaR of bundle scores (bundles of 5
  drawn identically for every method) and the covariance (and correlation) between a completion's length-normalised
  log-probability and its advantage within each prompt's group; at the end Pass@k (k = 1..16) per difficulty bucket.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import torch  # noqa: E402

from benchmarks._common import RESULTS_DIR, headless_pyplot, machine_info, mean_std, save_figure, write_results  # noqa: E402
from riskpo_trl.evaluation.metrics import mean_pass_at_k  # noqa: E402

METHODS = ("grpo", "gspo", "riskpo", "riskpo_authors", "risk_seeking")
METHOD_LABELS = {
    "grpo": "GRPO (TRL defaults)",
    "gspo": "GSPO (sequence ratio)",
    "riskpo": "RiskPO (paper)",
    "riskpo_authors": "RiskPO, authors' DAPO advantage",
    "risk_seeking": "Risk-seeking",
}
AUTHORS_FIELDS = {
    "advantage_scaling": "authors_code",
    "quantile_source": "group",
    "natural_baseline": False,
    "credit_assignment": "sum_mean",
    "risk_omega": 1.5,
}
SELECTION_CRITERION = "mean of validation Pass@1 and Pass@16 over all buckets (ties: the smaller lr)"


@dataclass(frozen=True)
class LMConfig:
    """Every knob of the study, fixed before the first RL run."""

    # model: a config-built Qwen2 with the character tokenizer of riskpo_trl.tiny_model (the toy replication's size)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    # task: a+b= with both operands of d digits, one bucket per d
    digits: tuple[int, ...] = (2, 3, 4)
    num_val_per_bucket: int = 50
    num_test_per_bucket: int = 100
    num_rl_train_per_bucket: int = 1000
    split_seed: int = 0
    # SFT (calibrated on the SFT start only, before the RL grid was fixed): stop at the first check where the easy
    # bucket's validation Pass@16 reaches sft_target_easy_pass16, or at sft_max_steps
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    sft_max_steps: int = 3000
    sft_eval_every: int = 100
    sft_target_easy_pass16: float = 0.8
    sft_pairs_per_bucket: int = 10_000  # cycled over epochs; tokenising more costs minutes
    # RL: identical for every method
    learning_rates: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    grid_seed: int = 0
    test_seeds: tuple[int, ...] = (0, 1, 2)
    generation_batches: int = 60  # 240 updates; sized so the study fits ~1 h on 2 busy cores
    prompts_per_generation: int = 20
    num_generations: int = 8
    updates_per_generation: int = 4
    bundle_size: int = 5
    temperature: float = 0.8
    max_completion_length: int = 7  # at most 5 digits, EOS, one slack token
    # evaluation (same sampling as training)
    eval_samples: int = 16
    ks: tuple[int, ...] = tuple(range(1, 17))
    eval_seed: int = 1234
    risk_alpha: float = 0.2  # level of the post hoc lower-tail RVaR, for every method

    def scaled_down(self) -> LMConfig:
        """Minimal sizes for the smoke test: seconds, not minutes. The numbers mean nothing."""
        return replace(
            self,
            hidden_size=16,
            intermediate_size=32,
            num_val_per_bucket=2,
            num_test_per_bucket=2,
            num_rl_train_per_bucket=20,
            sft_max_steps=2,
            sft_pairs_per_bucket=50,
            sft_eval_every=1,
            learning_rates=(1e-4,),
            test_seeds=(0, 1),
            generation_batches=1,
            prompts_per_generation=5,
            num_generations=4,
            updates_per_generation=2,
            eval_samples=2,
            ks=(1, 2),
        )


def method_available(method: str) -> bool:
    """``riskpo_authors`` needs the issue-10 fields on ``RiskPOConfig``; every other method always runs."""
    if method != "riskpo_authors":
        return True
    from riskpo_trl import RiskPOConfig

    names = {f.name for f in dataclasses.fields(RiskPOConfig)}
    return set(AUTHORS_FIELDS) <= names


# --- task --------------------------------------------------------------------------------------------------------

Problem = tuple[int, int]


@dataclass
class Splits:
    train: dict[int, list[Problem]]  # RL training prompts per bucket (SFT draws fresh pairs, avoiding val/test)
    val: dict[int, list[Problem]]
    test: dict[int, list[Problem]]


def make_splits(cfg: LMConfig) -> Splits:
    rng = random.Random(cfg.split_seed)
    train, val, test = {}, {}, {}
    for d in cfg.digits:
        low, high = 10 ** (d - 1), 10**d - 1
        wanted = cfg.num_val_per_bucket + cfg.num_test_per_bucket + cfg.num_rl_train_per_bucket
        pairs: set[Problem] = set()
        ordered: list[Problem] = []
        while len(ordered) < wanted:
            pair = (rng.randint(low, high), rng.randint(low, high))
            if pair not in pairs:
                pairs.add(pair)
                ordered.append(pair)
        val[d] = ordered[: cfg.num_val_per_bucket]
        test[d] = ordered[cfg.num_val_per_bucket : cfg.num_val_per_bucket + cfg.num_test_per_bucket]
        train[d] = ordered[cfg.num_val_per_bucket + cfg.num_test_per_bucket :]
    return Splits(train=train, val=val, test=test)


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}="


def exact_match_reward(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """Binary verifiable reward: 1.0 iff the completion is exactly the sum (surrounding whitespace ignored)."""
    return [float(completion.strip() == target) for completion, target in zip(completions, answer)]


def sft_pairs(cfg: LMConfig, splits: Splits, per_bucket: int) -> list[Problem]:
    """Fresh SFT pairs, never a validation or test problem, equally many per bucket."""
    held_out = {p for split in (splits.val, splits.test) for pairs in split.values() for p in pairs}
    rng = random.Random(cfg.split_seed + 1)
    out = []
    for d in cfg.digits:
        low, high = 10 ** (d - 1), 10**d - 1
        count = 0
        while count < per_bucket:
            pair = (rng.randint(low, high), rng.randint(low, high))
            if pair not in held_out:
                out.append(pair)
                count += 1
    rng.shuffle(out)
    return out


# --- evaluation --------------------------------------------------------------------------------------------------


def evaluate(model, tokenizer, problems: dict[int, list[Problem]], cfg: LMConfig) -> dict[str, Any]:
    """Pass@k per bucket and overall from ``eval_samples`` completions per problem, sampled with the library's
    ``TransformersBackend`` at the training temperature; Pass@k through ``riskpo_trl.evaluation.metrics``."""
    from riskpo_trl.evaluation.generation import SamplingSettings, TransformersBackend

    model.generation_config.top_k = None  # plain temperature sampling over the whole vocabulary, as in training
    backend = TransformersBackend(model, tokenizer, batch_size=64)
    settings = SamplingSettings(
        num_samples=cfg.eval_samples, temperature=cfg.temperature, top_p=1.0, max_new_tokens=cfg.max_completion_length
    )
    torch.manual_seed(cfg.eval_seed)
    out: dict[str, Any] = {}
    all_counts: list[int] = []
    for d, pairs in problems.items():
        samples = backend.generate([prompt_of(a, b) for a, b in pairs], settings)
        counts = [sum(s.text.strip() == str(a + b) for s in group) for (a, b), group in zip(pairs, samples)]
        all_counts += counts
        out[f"{d}digit"] = pass_at_ks(counts, cfg)
    out["all"] = pass_at_ks(all_counts, cfg)
    return out


def pass_at_ks(counts: list[int], cfg: LMConfig) -> dict[str, float]:
    return {f"pass@{k}": mean_pass_at_k([cfg.eval_samples] * len(counts), counts, k) for k in cfg.ks}


def selection_score(val: dict[str, Any], cfg: LMConfig) -> float:
    """The fixed lr-selection criterion (``SELECTION_CRITERION``)."""
    return (val["all"]["pass@1"] + val["all"][f"pass@{cfg.ks[-1]}"]) / 2


# --- SFT ---------------------------------------------------------------------------------------------------------


def run_sft(cfg: LMConfig, out_dir: Path) -> dict[str, Any]:
    """Train the shared start with TRL's SFTTrainer and save it under ``out_dir / "models" / "sft"``."""
    summary_path = out_dir / "sft_summary.json"
    sft_dir = out_dir / "models" / "sft"
    if summary_path.exists() and (sft_dir / "config.json").exists():
        return json.loads(summary_path.read_text())
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from riskpo_trl.tiny_model import build_tiny_model

    splits = make_splits(cfg)
    init_dir = out_dir / "models" / "init"
    build_tiny_model(
        init_dir,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=64,
        seed=0,
    )
    pairs = sft_pairs(cfg, splits, per_bucket=cfg.sft_pairs_per_bucket)
    train = Dataset.from_list([{"prompt": prompt_of(a, b), "completion": str(a + b)} for a, b in pairs])
    history: list[dict[str, Any]] = []
    easy = min(cfg.digits)
    check_cfg = replace(cfg, eval_samples=min(cfg.eval_samples, 16))

    class StopWhenEasySolved(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % cfg.sft_eval_every:
                return
            val = evaluate(model, processing_class, splits.val, check_cfg)
            model.train()
            entry = {"step": state.global_step, **{b: {k: v for k, v in r.items() if k in ("pass@1", "pass@16",
                     f"pass@{check_cfg.ks[-1]}")} for b, r in val.items()}}
            history.append(entry)
            print(f"[sft] step {state.global_step}: {entry}", flush=True)
            if val[f"{easy}digit"][f"pass@{check_cfg.ks[-1]}"] >= cfg.sft_target_easy_pass16:
                control.should_training_stop = True

    args = SFTConfig(
        output_dir=str(out_dir / "models" / "sft_run"),
        max_steps=cfg.sft_max_steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_lr,
        lr_scheduler_type="constant",
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=0,
        dataloader_drop_last=True,
        max_length=32,
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    trainer = SFTTrainer(
        model=str(init_dir), args=args, train_dataset=train, processing_class=tokenizer,
        callbacks=[StopWhenEasySolved()],
    )
    start = time.perf_counter()
    trainer.train()
    trainer.save_model(str(sft_dir))
    splits_eval = {"val": evaluate(trainer.model, tokenizer, splits.val, cfg),
                   "test": evaluate(trainer.model, tokenizer, splits.test, cfg)}
    summary = {"steps": trainer.state.global_step, "seconds": time.perf_counter() - start, "history": history,
               **splits_eval}
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[sft] saved after {summary['steps']} steps; test {summary['test']}", flush=True)
    return summary


# --- RL ----------------------------------------------------------------------------------------------------------


class RewardRecorder:
    """The exact-match reward, keeping every training generation batch's rewards for the post hoc tail statistic."""

    __name__ = "exact_match_reward"

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self._pending: list[float] = []

    def __call__(self, completions, answer, **kwargs) -> list[float]:
        rewards = exact_match_reward(completions, answer)
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


def with_covariance_probe(trainer_cls):
    """``trainer_cls`` that also logs, for each training generation batch, the covariance and the correlation between
    a completion's length-normalised log-probability (under the policy that sampled it) and its advantage, within
    each prompt's group, averaged over prompts (Proposition 1's quantity). Everything else is inherited."""

    class CovarianceProbe(trainer_cls):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            old = output.get("old_per_token_logps")
            if self.model.training and old is not None:
                mask = output["completion_mask"].float()
                logp = (old * mask).sum(1) / mask.sum(1).clamp(min=1)
                adv = output["advantages"].float()
                g = self.num_generations
                lp, a = logp.view(-1, g), adv.view(-1, g)
                lp_c, a_c = lp - lp.mean(1, keepdim=True), a - a.mean(1, keepdim=True)
                cov = (lp_c * a_c).sum(1) / (g - 1)
                denom = (lp_c.pow(2).sum(1) * a_c.pow(2).sum(1)).sqrt()
                corr = torch.where(denom > 0, (lp_c * a_c).sum(1) / denom.clamp(min=1e-12), torch.zeros_like(denom))
                self._metrics["train"]["probe/logprob_adv_cov"].append(cov.mean().item())
                self._metrics["train"]["probe/logprob_adv_corr"].append(corr.mean().item())
            return output

    CovarianceProbe.__name__ = f"Probed{trainer_cls.__name__}"
    return CovarianceProbe


def rl_config(method: str, lr: float, seed: int, cfg: LMConfig, output_dir: Path):
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
    }
    if method == "grpo":
        return GRPOConfig(**common)
    if method == "gspo":
        return GRPOConfig(**common, importance_sampling_level="sequence", loss_type="grpo")
    risk = {"bundle_size": cfg.bundle_size}
    if method == "riskpo":
        return RiskPOConfig(**common, **risk)
    if method == "risk_seeking":
        return RiskPOConfig(**common, **risk, risk_profile="risk_seeking")
    if method == "riskpo_authors":
        return RiskPOConfig(**common, **risk, **AUTHORS_FIELDS)
    raise ValueError(f"Unknown method {method!r}; choose one of {METHODS}.")


def run_name(method: str, lr: float, seed: int) -> str:
    return f"{method}-lr{lr:g}-seed{seed}"


def run_rl(method: str, lr: float, seed: int, cfg: LMConfig, out_dir: Path) -> dict[str, Any]:
    """One RL run from the SFT start; writes ``runs/<name>.json`` (curves, validation and test Pass@k)."""
    path = out_dir / "runs" / f"{run_name(method, lr, seed)}.json"
    if path.exists():
        return json.loads(path.read_text())
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from riskpo_trl import RiskPOTrainer

    splits = make_splits(cfg)
    train_rows = [
        {"prompt": prompt_of(a, b), "answer": str(a + b)} for pairs in splits.train.values() for a, b in pairs
    ]
    recorder = RewardRecorder()
    sft_dir = out_dir / "models" / "sft"
    args = rl_config(method, lr, seed, cfg, out_dir / "models" / "rl" / run_name(method, lr, seed))
    trainer_cls = with_covariance_probe(GRPOTrainer if method in ("grpo", "gspo") else RiskPOTrainer)
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    trainer = trainer_cls(
        model=str(sft_dir), reward_funcs=recorder, args=args, train_dataset=Dataset.from_list(train_rows),
        processing_class=tokenizer,
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    history = trainer.state.log_history

    def curve(key: str) -> list[float]:
        return [entry[key] for entry in history if key in entry]

    curves = {
        "reward": [sum(b) / len(b) for b in recorder.batches],
        "lower_rvar": [
            lower_tail_rvar(b, cfg.num_generations, cfg.bundle_size, cfg.risk_alpha, seed=i)
            for i, b in enumerate(recorder.batches)
        ],
        "entropy": curve("entropy"),
        "logprob_adv_cov": curve("probe/logprob_adv_cov"),
        "logprob_adv_corr": curve("probe/logprob_adv_corr"),
        "clip_ratio": curve("clip_ratio/region_mean"),
    }
    result = {
        "method": method,
        "lr": lr,
        "seed": seed,
        "train_seconds": seconds,
        "curves": curves,
        "val": evaluate(trainer.model, tokenizer, splits.val, cfg),
        "test": evaluate(trainer.model, tokenizer, splits.test, cfg),
    }
    result["selection_score"] = selection_score(result["val"], cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    tmp.replace(path)  # atomic: an interrupted run leaves no half-written cache entry
    print(f"[rl] {run_name(method, lr, seed)}: {seconds:.0f}s, val score {result['selection_score']:.3f}", flush=True)
    return result


def _worker(job: tuple[str, float, int, LMConfig, Path]) -> str:
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    method, lr, seed, cfg, out_dir = job
    try:
        run_rl(method, lr, seed, cfg, out_dir)
        return f"{run_name(method, lr, seed)}: ok"
    except Exception as error:  # one failed run must not take the others down; it is reported and rerun next time
        import traceback

        traceback.print_exc()
        return f"{run_name(method, lr, seed)}: FAILED {type(error).__name__}: {error}"


def run_jobs(jobs: list[tuple], workers: int) -> list[str]:
    if workers <= 1 or len(jobs) <= 1:
        return [_worker(job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
        return list(pool.imap_unordered(_worker, jobs))


def select_lrs(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, float]:
    """Per method, the grid lr with the best validation criterion; only for methods whose grid is complete."""
    chosen = {}
    for method in methods:
        scores = {}
        for lr in cfg.learning_rates:
            path = out_dir / "runs" / f"{run_name(method, lr, cfg.grid_seed)}.json"
            if path.exists():
                scores[lr] = json.loads(path.read_text())["selection_score"]
        if len(scores) == len(cfg.learning_rates):
            chosen[method] = max(sorted(scores), key=lambda lr: scores[lr])  # max keeps the first (smallest) on ties
    return chosen


# --- gradient diagnostics ----------------------------------------------------------------------------------------


def advantage_for(method: str, rewards: torch.Tensor, cfg: LMConfig, tracker, generator) -> torch.Tensor:
    """Each method's advantage on one generation batch, through the library's code (GRPO: TRL's group formula)."""
    from riskpo_trl.risk import group_quantiles, permutation_bundles, riskpo_advantages

    g = cfg.num_generations
    if method in ("grpo", "gspo"):
        grouped = rewards.view(-1, g)
        return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
    bundles = permutation_bundles(rewards, g, cfg.bundle_size, generator)
    levels = (0.2, 0.8)
    extra: dict[str, Any] = {}
    if method == "riskpo_authors":
        q_alpha, q_beta = group_quantiles(bundles[0], g, list(levels)).unbind(dim=1)
        extra = {k: v for k, v in AUTHORS_FIELDS.items() if k not in ("quantile_source", "risk_omega")}
        extra["levels"] = levels
        omega, profile = AUTHORS_FIELDS["risk_omega"], "mvar"
    else:
        q_alpha, q_beta = tracker.update(bundles[0]).tolist()
        omega, profile = 0.5, ("risk_seeking" if method == "risk_seeking" else "mvar")
    return riskpo_advantages(rewards, num_generations=g, bundle_size=cfg.bundle_size, q_alpha=q_alpha, q_beta=q_beta,
                             omega=omega, risk_profile=profile, bundles=bundles, **extra).advantages


def _answer_loglik_gradient(model, tokenizer, batch, params, temperature: float) -> torch.Tensor:
    """Gradient of the mean length-normalised log-likelihood of the correct answers (with EOS) to ``batch``'s
    prompts, at the sampling temperature: the direction in which every right answer becomes likelier."""
    seqs, prompt_lens = [], []
    for _, a, b in batch:
        prompt_ids = tokenizer(prompt_of(a, b), add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(prompt_ids + answer_ids)
        prompt_lens.append(len(prompt_ids))
    width = max(len(x) for x in seqs)
    input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in seqs])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / temperature
    token_logp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    action = (torch.arange(1, width).unsqueeze(0) >= torch.tensor(prompt_lens).unsqueeze(1)) & (attention[:, 1:] == 1)
    loglik = ((token_logp * action).sum(1) / action.sum(1)).mean()
    return torch.cat([x.reshape(-1) for x in torch.autograd.grad(loglik, params)])


def gradient_diagnostics(cfg: LMConfig, out_dir: Path, methods: list[str], num_batches: int = 32) -> dict[str, Any]:
    """At the SFT start, on the *same* sampled generation batches for every method (paired): the signal-to-noise
    ratio of the batch policy gradient (sequence-level score function, length-normalised log-prob, as GSPO/RiskPO's
    loss at ratio 1), the cosine of each method's mean gradient with GRPO's and with the gradient of the log-likelihood
    of the correct answers to the same prompts (the direction that makes right answers likelier; a negative cosine
    means the update makes them less likely), the fraction of completions with a positive advantage and with a
    negative one, and the share of total |advantage| that lands on each difficulty bucket. Cached in
    ``gradient_diagnostics.json``."""
    path = out_dir / "gradient_diagnostics.json"
    if path.exists():
        return json.loads(path.read_text())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from riskpo_trl.evaluation.generation import SamplingSettings, TransformersBackend
    from riskpo_trl.quantile_tracker import QuantileTracker

    sft_dir = out_dir / "models" / "sft"
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir)
    model.generation_config.top_k = None
    backend = TransformersBackend(model, tokenizer, batch_size=64)
    settings = SamplingSettings(num_samples=cfg.num_generations, temperature=cfg.temperature, top_p=1.0,
                                max_new_tokens=cfg.max_completion_length)
    splits = make_splits(cfg)
    pool = [(d, a, b) for d, pairs in splits.train.items() for a, b in pairs]
    rng = random.Random(99)
    torch.manual_seed(99)
    trackers = {m: QuantileTracker((0.2, 0.8), lr=0.1) for m in methods}
    generators = {m: torch.Generator().manual_seed(7) for m in methods}
    grads: dict[str, list[torch.Tensor]] = {m: [] for m in methods}
    truth_grads: list[torch.Tensor] = []
    signs = {m: {"positive": 0, "negative": 0, "total": 0} for m in methods}
    mass = {m: {f"{d}digit": 0.0 for d in cfg.digits} for m in methods}
    params = [p for p in model.parameters() if p.requires_grad]
    eos = tokenizer.eos_token_id
    for _ in range(num_batches):
        batch = rng.sample(pool, cfg.prompts_per_generation)
        prompts = [prompt_of(a, b) for _, a, b in batch]
        samples = backend.generate(prompts, settings)
        rewards, seqs, prompt_lens, buckets = [], [], [], []
        for (d, a, b), prompt, group in zip(batch, prompts, samples):
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            for sample in group:
                ids = tokenizer(sample.text, add_special_tokens=False)["input_ids"]
                if sample.num_tokens > len(ids):  # the completion ended with EOS: it is part of the action
                    ids = ids + [eos]
                seqs.append(prompt_ids + ids)
                prompt_lens.append(len(prompt_ids))
                rewards.append(float(sample.text.strip() == str(a + b)))
                buckets.append(f"{d}digit")
        width = max(len(x) for x in seqs)
        input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in seqs])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
        model.train()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / cfg.temperature
        token_logp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        positions = torch.arange(1, width).unsqueeze(0)
        action = (positions >= torch.tensor(prompt_lens).unsqueeze(1)) & (attention[:, 1:] == 1)
        seq_logp = (token_logp * action).sum(1) / action.sum(1).clamp(min=1)
        reward_t = torch.tensor(rewards)
        truth_grads.append(_answer_loglik_gradient(model, tokenizer, batch, params, cfg.temperature))
        for m in methods:
            adv = advantage_for(m, reward_t, cfg, trackers[m], generators[m]).float()
            # A tolerance: the paper's MVaR formula cancels to ~1e-17, not exactly 0, above q_beta.
            signs[m]["positive"] += int((adv > 1e-6).sum())
            signs[m]["negative"] += int((adv < -1e-6).sum())
            signs[m]["total"] += adv.numel()
            for bucket, value in zip(buckets, adv.abs().tolist()):
                mass[m][bucket] += value
            grad = torch.autograd.grad((adv * seq_logp).mean(), params, retain_graph=True)
            grads[m].append(torch.cat([x.reshape(-1) for x in grad]))
    out: dict[str, Any] = {"num_batches": num_batches, "methods": {}}
    grpo_mean = torch.stack(grads["grpo"]).mean(0) if "grpo" in grads else None
    truth = torch.stack(truth_grads).mean(0)
    for m in methods:
        g = torch.stack(grads[m])
        mean = g.mean(0)
        noise = (g - mean).pow(2).sum(1).mean()
        total = sum(mass[m].values()) or 1.0
        out["methods"][m] = {
            "snr": (mean.pow(2).sum() / noise.clamp(min=1e-30)).item(),
            "cosine_of_mean_gradient_with_grpo": (
                torch.nn.functional.cosine_similarity(mean, grpo_mean, dim=0).item() if grpo_mean is not None else None
            ),
            "cosine_of_mean_gradient_with_answer_loglik": torch.nn.functional.cosine_similarity(
                mean, truth, dim=0
            ).item(),
            "mean_batch_cosine_with_answer_loglik": torch.nn.functional.cosine_similarity(
                g, torch.stack(truth_grads), dim=1
            ).nan_to_num(0.0).mean().item(),
            "fraction_positive_advantage": signs[m]["positive"] / max(1, signs[m]["total"]),
            "fraction_negative_advantage": signs[m]["negative"] / max(1, signs[m]["total"]),
            "abs_advantage_share_by_bucket": {b: v / total for b, v in mass[m].items()},
        }
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out


# --- report ------------------------------------------------------------------------------------------------------


def load_runs(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, dict[str, Any]]:
    runs = {}
    for method in methods:
        for lr in cfg.learning_rates:
            for seed in sorted({cfg.grid_seed, *cfg.test_seeds}):
                path = out_dir / "runs" / f"{run_name(method, lr, seed)}.json"
                if path.exists():
                    runs[run_name(method, lr, seed)] = json.loads(path.read_text())
    return runs


def _tail_mean(values: list[float], fraction: float = 0.25) -> float:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan")
    tail = values[-max(1, int(len(values) * fraction)) :]
    return sum(tail) / len(tail)


def summarize(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, Any]:
    runs = load_runs(cfg, out_dir, methods)
    chosen = select_lrs(cfg, out_dir, methods)
    grid = {
        name: {"method": r["method"], "lr": r["lr"], "seed": r["seed"], "selection_score": r["selection_score"],
               "val_pass@1": r["val"]["all"]["pass@1"],
               f"val_pass@{cfg.ks[-1]}": r["val"]["all"][f"pass@{cfg.ks[-1]}"],
               "test_pass@1": r["test"]["all"]["pass@1"], "train_seconds": r["train_seconds"]}
        for name, r in runs.items() if r["seed"] == cfg.grid_seed
    }
    table: dict[str, Any] = {}
    buckets = ["all"] + [f"{d}digit" for d in cfg.digits]
    for method, lr in chosen.items():
        rs = [runs[run_name(method, lr, s)] for s in cfg.test_seeds if run_name(method, lr, s) in runs]
        if not rs:
            continue
        row: dict[str, Any] = {"lr": lr, "seeds": [r["seed"] for r in rs]}
        for bucket in buckets:
            for k in cfg.ks:
                row[f"{bucket}/pass@{k}"] = mean_std([r["test"][bucket][f"pass@{k}"] for r in rs])
        for key in ("entropy", "reward", "lower_rvar", "logprob_adv_cov", "logprob_adv_corr"):
            row[f"final_{key}"] = mean_std([_tail_mean(r["curves"][key]) for r in rs])
        row["mean_logprob_adv_corr"] = mean_std(
            [sum(r["curves"]["logprob_adv_corr"]) / max(1, len(r["curves"]["logprob_adv_corr"])) for r in rs]
        )
        row["train_seconds"] = mean_std([r["train_seconds"] for r in rs])
        table[method] = row
    return {"chosen_lr": chosen, "grid": grid, "methods": table, "runs": runs}


def _markdown(cfg: LMConfig, sft: dict[str, Any], summary: dict[str, Any], methods: list[str], skipped: list[str],
              missing: list[str], machine: dict[str, Any], wall: float | None,
              diagnostics: dict[str, Any] | None = None) -> str:
    top = cfg.ks[-1]
    ks_shown = [k for k in (1, 2, 4, 8, 16) if k in cfg.ks]
    buckets = [f"{d}digit" for d in cfg.digits]
    lines = [
        "# Tiny-LM study: mixed-length addition with a hard tail (CPU)",
        "",
        f"SFT start ({sft['steps']} SFT steps), test split: "
        + "; ".join(f"{b}: Pass@1 {sft['test'][b]['pass@1']:.3f}, Pass@{top} {sft['test'][b][f'pass@{top}']:.3f}"
                    for b in ["all", *buckets]),
        f"RL: {cfg.generation_batches} generation batches x {cfg.prompts_per_generation} prompts x "
        f"{cfg.num_generations} completions, {cfg.updates_per_generation} updates per batch, temperature "
        f"{cfg.temperature}; lr grid {list(cfg.learning_rates)} at seed {cfg.grid_seed}, chosen by: "
        f"{SELECTION_CRITERION}; test seeds {list(cfg.test_seeds)}, mean ± std.",
    ]
    if skipped:
        lines += ["", "Not run (library lacks the fields): " + ", ".join(skipped) + "."]
    if missing:
        lines += ["", "Not finished (rerun the command to resume): " + ", ".join(missing) + "."]
    lines += ["", "## Test results at the chosen lr", "",
              "| method | lr | " + " | ".join(f"Pass@{k}" for k in ks_shown)
              + " | entropy (last 25%) | lower RVaR (last 25%) | corr(log pi, A) (mean) |",
              "|---" * (len(ks_shown) + 5) + "|"]
    for method, row in summary["methods"].items():
        cells = [f"{row[f'all/pass@{k}'][0]:.3f} ± {row[f'all/pass@{k}'][1]:.3f}" for k in ks_shown]
        cells += [f"{row[key][0]:.3f} ± {row[key][1]:.3f}"
                  for key in ("final_entropy", "final_lower_rvar", "mean_logprob_adv_corr")]
        lines.append(f"| {METHOD_LABELS[method]} | {row['lr']:g} | " + " | ".join(cells) + " |")
    lines += ["", "## Test Pass@1 / Pass@16 per difficulty bucket", "",
              "| method | " + " | ".join(f"{b} Pass@1 | {b} Pass@{top}" for b in buckets) + " |",
              "|---" * (2 * len(buckets) + 1) + "|",
              "| SFT start | " + " | ".join(f"{sft['test'][b]['pass@1']:.3f} | {sft['test'][b][f'pass@{top}']:.3f}"
                                           for b in buckets) + " |"]
    for method, row in summary["methods"].items():
        cells = []
        for b in buckets:
            cells += [f"{row[f'{b}/pass@1'][0]:.3f} ± {row[f'{b}/pass@1'][1]:.3f}",
                      f"{row[f'{b}/pass@{top}'][0]:.3f} ± {row[f'{b}/pass@{top}'][1]:.3f}"]
        lines.append(f"| {METHOD_LABELS[method]} | " + " | ".join(cells) + " |")
    lines += ["", "## The whole lr grid (seed %d; selection on validation)" % cfg.grid_seed, "",
              f"| method | lr | val Pass@1 | val Pass@{top} | criterion | chosen | test Pass@1 | train s |",
              "|---" * 8 + "|"]
    for name, g in sorted(summary["grid"].items(), key=lambda kv: (methods.index(kv[1]["method"]), kv[1]["lr"])):
        chosen = "yes" if summary["chosen_lr"].get(g["method"]) == g["lr"] else ""
        lines.append(f"| {METHOD_LABELS[g['method']]} | {g['lr']:g} | {g['val_pass@1']:.3f} | "
                     f"{g[f'val_pass@{top}']:.3f} | {g['selection_score']:.3f} | {chosen} | {g['test_pass@1']:.3f} | "
                     f"{g['train_seconds']:.0f} |")
    if diagnostics:
        lines += ["", f"## Gradient noise at the SFT start ({diagnostics['num_batches']} paired generation batches)",
                  "",
                  "| method | SNR of batch gradient | cos(mean gradient, GRPO's) | cos(mean gradient, grad log-lik of "
                  "right answers) | mean batch cos with it | A > 0 / A < 0 | share of abs(A): " + " / ".join(buckets)
                  + " |", "|---|---|---|---|---|---|---|"]
        for m, d in diagnostics["methods"].items():
            cos = d["cosine_of_mean_gradient_with_grpo"]
            lines.append(f"| {METHOD_LABELS[m]} | {d['snr']:.4f} | {'' if cos is None else f'{cos:.3f}'} | "
                         f"{d['cosine_of_mean_gradient_with_answer_loglik']:+.3f} | "
                         f"{d['mean_batch_cosine_with_answer_loglik']:+.3f} | "
                         f"{d['fraction_positive_advantage']:.2f} / "
                         f"{d['fraction_negative_advantage']:.2f} | "
                         + " / ".join(f"{d['abs_advantage_share_by_bucket'][b]:.2f}" for b in buckets) + " |")
    lines += ["", f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores shared with other jobs, load "
              f"average at report time {machine.get('load_average_at_start')}, torch {machine['torch']}, trl "
              f"{machine['trl']}." + (f" Wall time of this invocation: {wall / 60:.1f} min." if wall else "")]
    return "\n".join(lines)


def _smooth(values, window: int):
    import numpy as np

    values = np.asarray(values, dtype=float)
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    return (cumsum[1:] - cumsum[np.maximum(idx - window, 0)]) / np.minimum(idx, window)


def plot(cfg: LMConfig, sft: dict[str, Any], summary: dict[str, Any], out_dir: Path) -> list[Path]:
    plt = headless_pyplot()
    import numpy as np

    paths = []
    keys = [("reward", "mean reward"), ("entropy", "token entropy"),
            ("lower_rvar", f"lower-tail RVaR (alpha={cfg.risk_alpha}, B={cfg.bundle_size})"),
            ("logprob_adv_corr", "corr(log pi, A) within groups")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for method, row in summary["methods"].items():
        rs = [summary["runs"][run_name(method, row["lr"], s)] for s in row["seeds"]]
        for ax, (key, title) in zip(axes, keys):
            length = min(len(r["curves"][key]) for r in rs)
            if length == 0:
                continue
            arr = np.array([r["curves"][key][:length] for r in rs], dtype=float)
            x = np.linspace(1, cfg.generation_batches, length)
            window = max(1, length // 10)
            mean, std = _smooth(arr.mean(0), window), _smooth(arr.std(0), window)
            ax.plot(x, mean, label=f"{METHOD_LABELS[method]} (lr {row['lr']:g})")
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("generation batch")
    axes[0].legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / "lm_training_curves.png"))

    buckets = [f"{d}digit" for d in cfg.digits] + ["all"]
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.8 * len(buckets), 3.4), sharey=True)
    for ax, bucket in zip(axes, buckets):
        ax.plot(cfg.ks, [sft["test"][bucket][f"pass@{k}"] for k in cfg.ks], "k--", label="SFT start")
        for method, row in summary["methods"].items():
            mean = np.array([row[f"{bucket}/pass@{k}"][0] for k in cfg.ks])
            std = np.array([row[f"{bucket}/pass@{k}"][1] for k in cfg.ks])
            ax.plot(cfg.ks, mean, marker=".", label=METHOD_LABELS[method])
            ax.fill_between(cfg.ks, mean - std, mean + std, alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_title(f"test, {bucket}", fontsize=9)
        ax.set_xlabel("k")
    axes[0].set_ylabel("Pass@k")
    axes[0].legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / "lm_pass_at_k_by_difficulty.png"))
    return paths


def report(cfg: LMConfig, out_dir: Path, methods: list[str], skipped: list[str], wall: float | None = None):
    sft = json.loads((out_dir / "sft_summary.json").read_text())
    summary = summarize(cfg, out_dir, methods)
    expected = {run_name(m, lr, cfg.grid_seed) for m in methods for lr in cfg.learning_rates}
    expected |= {run_name(m, lr, s) for m, lr in summary["chosen_lr"].items() for s in cfg.test_seeds}
    missing = sorted(expected - set(summary["runs"]))
    missing += [f"{m} (test seeds: lr not chosen yet)" for m in methods if m not in summary["chosen_lr"]]
    machine = machine_info()
    diagnostics_path = out_dir / "gradient_diagnostics.json"
    diagnostics = json.loads(diagnostics_path.read_text()) if diagnostics_path.exists() else None
    text = _markdown(cfg, sft, summary, methods, skipped, missing, machine, wall, diagnostics)
    payload = {"config": asdict(cfg), "selection_criterion": SELECTION_CRITERION, "machine": machine,
               "wall_seconds": wall, "not_run": skipped, "not_finished": missing, "sft": sft,
               "gradient_diagnostics": diagnostics,
               **{k: v for k, v in summary.items() if k != "runs"}}
    write_results("lm_study", payload, text, out_dir)
    if summary["methods"]:
        plot(cfg, sft, summary, out_dir)
    print(text)
    return payload


# --- CLI ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="Trivial sizes for the test suite; numbers mean nothing.")
    parser.add_argument("--out", type=Path, default=None,
                        help="Output folder (default benchmarks/results/lm, or lm-smoke with --smoke). Models go to "
                             "<out>/models, which git ignores.")
    parser.add_argument("--workers", type=int, default=2, help="Parallel RL runs, one torch thread each.")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--report-only", action="store_true", help="Only tables and figures from finished runs.")
    parser.add_argument("--extra-lrs", nargs="+", type=float, default=[],
                        help="Add learning rates to the grid (a post hoc extension; use a separate --out so the "
                             "pre-registered selection stays as it was).")
    parser.add_argument("--skip-diagnostics", action="store_true",
                        help="Do not measure the gradient noise of each advantage at the SFT start.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    cfg = LMConfig().scaled_down() if args.smoke else LMConfig()
    if args.extra_lrs:
        cfg = replace(cfg, learning_rates=tuple(sorted(set(cfg.learning_rates) | set(args.extra_lrs))))
    out = args.out or RESULTS_DIR / ("lm-smoke" if args.smoke else "lm")
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods if method_available(m)]
    skipped = [METHOD_LABELS[m] for m in args.methods if m not in methods]
    start = time.perf_counter()
    if not args.report_only:
        run_sft(cfg, out)
        grid_jobs = [(m, lr, cfg.grid_seed, cfg, out) for lr in cfg.learning_rates for m in methods]
        for line in run_jobs(grid_jobs, args.workers):
            print("[grid]", line, flush=True)
        chosen = select_lrs(cfg, out, methods)
        print(f"[select] {chosen}", flush=True)
        seed_jobs = [(m, lr, s, cfg, out) for s in cfg.test_seeds for m, lr in chosen.items()]
        for line in run_jobs(seed_jobs, args.workers):
            print("[seeds]", line, flush=True)
        if not args.skip_diagnostics:
            gradient_diagnostics(cfg, out, [m for m in methods if m != "gspo"],  # GSPO's advantage is GRPO's
                                 num_batches=3 if args.smoke else 32)
    return report(cfg, out, methods, skipped, time.perf_counter() - start)


if __name__ == "__main__":
    main()
