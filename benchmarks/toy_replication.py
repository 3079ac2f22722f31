"""A CPU-scale replication of RiskPO's claims: GRPO vs RiskPO (MVaR) vs the risk-seeking ablation on 2-digit addition.

The pipeline, each step a subcommand (``all`` runs them in order)::

    python -m benchmarks.toy_replication sft      # SFT a tiny Qwen2 until Pass@1 is ~25%: the shared start
    python -m benchmarks.toy_replication rl       # GRPO / RiskPO / risk-seeking from that start, several seeds each
    python -m benchmarks.toy_replication report   # tables (JSON + markdown) and the paper-style figures

Everything that could be tuned is fixed in :class:`ToyConfig` *before* any comparison was run; no value was changed
after looking at the results. All methods share the model, data, seed list, number of steps, generation batch, learning
rate, temperature and loss settings; only the advantage differs.

The task: prompt ``"a+b="`` with ``a, b`` in ``[10, 99]``, reward 1 if the completion is exactly ``str(a + b)``
(surrounding whitespace ignored), else 0. Held-out problems never appear in SFT or RL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from benchmarks._common import RESULTS_DIR, machine_info, mean_std, write_results  # noqa: E402
from riskpo_trl.evaluation.metrics import mean_pass_at_k  # noqa: E402

METHODS = ("grpo", "riskpo", "risk_seeking", "riskpo_authors")
METHOD_LABELS = {
    "grpo": "GRPO",
    "riskpo": "RiskPO (MVaR)",
    "risk_seeking": "Risk-seeking",
    "riskpo_authors": "RiskPO, authors' code opt-ins",
}


@dataclass(frozen=True)
class ToyConfig:
    """Every knob of the replication, fixed up front (see the module docstring)."""

    # model: a config-built Qwen2 with the character tokenizer of riskpo_trl.tiny_model
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    # data
    operand_low: int = 10
    operand_high: int = 99
    num_test: int = 200  # held-out problems for Pass@k
    num_val: int = 100  # used only to decide when SFT stops
    split_seed: int = 0
    # SFT: train until the validation Pass@1 (sampled) reaches sft_target_pass1, checked every sft_eval_every steps
    sft_lr: float = 1e-3
    sft_batch_size: int = 64
    sft_max_steps: int = 4000
    sft_eval_every: int = 25
    sft_target_pass1: float = 0.25
    # RL: identical for every method
    rl_steps: int = 200
    rl_lr: float = 1e-4
    num_generations: int = 8
    prompts_per_step: int = 10  # generation batch = 80 completions, 2 bundle groups of bundle_size=5
    bundle_size: int = 5
    max_completion_length: int = 5  # answers have at most 3 digits, plus EOS and some slack
    temperature: float = 1.0
    seeds: tuple[int, ...] = (0, 1, 2)
    # evaluation
    eval_samples: int = 16  # n samples per held-out problem; Pass@k for k <= n
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    risk_alpha: float = 0.2  # also the level of the post hoc lower-tail RVaR reported for every method

    def scaled_down(self) -> ToyConfig:
        """A minimal size for smoke tests: seconds, not minutes. The numbers mean nothing."""
        return replace(
            self,
            hidden_size=16,
            intermediate_size=32,
            num_test=10,
            num_val=10,
            sft_max_steps=2,
            sft_eval_every=1,
            rl_steps=1,
            seeds=(0,),
            eval_samples=2,
            ks=(1, 2),
        )


# --- task --------------------------------------------------------------------------------------------------------


@dataclass
class Splits:
    train: list[tuple[int, int]]
    val: list[tuple[int, int]]
    test: list[tuple[int, int]] = field(default_factory=list)


def make_splits(cfg: ToyConfig) -> Splits:
    pairs = [
        (a, b)
        for a in range(cfg.operand_low, cfg.operand_high + 1)
        for b in range(cfg.operand_low, cfg.operand_high + 1)
    ]
    random.Random(cfg.split_seed).shuffle(pairs)
    test, val, train = (
        pairs[: cfg.num_test],
        pairs[cfg.num_test : cfg.num_test + cfg.num_val],
        pairs[cfg.num_test + cfg.num_val :],
    )
    return Splits(train=train, val=val, test=test)


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}="


def exact_match_reward(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """Binary verifiable reward: 1.0 iff the completion is exactly the sum."""
    return [float(completion.strip() == target) for completion, target in zip(completions, answer)]


def rl_dataset(pairs: list[tuple[int, int]]) -> Dataset:
    return Dataset.from_list([{"prompt": prompt_of(a, b), "answer": str(a + b)} for a, b in pairs])


# --- evaluation --------------------------------------------------------------------------------------------------


@torch.no_grad()
def sample_correct_counts(
    model,
    tokenizer,
    pairs: list[tuple[int, int]],
    num_samples: int,
    cfg: ToyConfig,
    seed: int,
    batch_prompts: int = 64,
) -> list[int]:
    """Draw ``num_samples`` completions per problem at the training temperature; count the exact matches."""
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    counts = []
    for start in range(0, len(pairs), batch_prompts):
        chunk = pairs[start : start + batch_prompts]
        enc = tokenizer([prompt_of(a, b) for a, b in chunk], return_tensors="pt", padding=True)
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=cfg.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=cfg.max_completion_length,
            num_return_sequences=num_samples,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, (a, b) in enumerate(chunk):
            answers = texts[i * num_samples : (i + 1) * num_samples]
            counts.append(sum(text.strip() == str(a + b) for text in answers))
    model.train(was_training)
    return counts


def pass_at_ks(counts: list[int], num_samples: int, ks: tuple[int, ...]) -> dict[str, float]:
    return {f"pass@{k}": mean_pass_at_k([num_samples] * len(counts), counts, k) for k in ks}


# --- SFT ---------------------------------------------------------------------------------------------------------


def run_sft(cfg: ToyConfig, out_dir: Path) -> dict[str, Any]:
    """Train the shared starting point with TRL's SFTTrainer and save it under ``out_dir / "sft_model"``."""
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from riskpo_trl.tiny_model import build_tiny_model

    splits = make_splits(cfg)
    init_dir = out_dir / "init_model"
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
    train = Dataset.from_list([{"prompt": prompt_of(a, b), "completion": str(a + b)} for a, b in splits.train])
    history: list[dict[str, float]] = []

    class StopAtTarget(TrainerCallback):
        """Stop as soon as the sampled Pass@1 on the validation split reaches the target."""

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % cfg.sft_eval_every:
                return
            counts = sample_correct_counts(model, processing_class, splits.val, 4, cfg, seed=state.global_step)
            pass1 = sum(counts) / (4 * len(counts))
            history.append({"step": state.global_step, "val_pass@1": pass1})
            print(f"[sft] step {state.global_step}: validation Pass@1 = {pass1:.3f}", flush=True)
            if pass1 >= cfg.sft_target_pass1:
                control.should_training_stop = True

    args = SFTConfig(
        output_dir=str(out_dir / "sft_run"),
        max_steps=cfg.sft_max_steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_lr,
        lr_scheduler_type="constant",
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=0,
        dataloader_drop_last=True,
        max_length=32,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=str(init_dir), args=args, train_dataset=train, callbacks=[StopAtTarget()])
    start = time.perf_counter()
    trainer.train()
    sft_dir = out_dir / "sft_model"
    trainer.save_model(str(sft_dir))
    counts = sample_correct_counts(trainer.model, trainer.processing_class, splits.test, cfg.eval_samples, cfg, seed=0)
    summary = {
        "steps": trainer.state.global_step,
        "seconds": time.perf_counter() - start,
        "val_history": history,
        "test": pass_at_ks(counts, cfg.eval_samples, cfg.ks),
    }
    (out_dir / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[sft] saved {sft_dir} after {summary['steps']} steps; held-out {summary['test']}", flush=True)
    return summary


# --- RL ----------------------------------------------------------------------------------------------------------


class RewardRecorder:
    """Reward function wrapper that keeps every generation batch's rewards, for the post hoc tail statistics."""

    __name__ = "exact_match_reward"

    def __init__(self) -> None:
        self.batches: list[list[float]] = []

    def __call__(self, completions, answer, **kwargs) -> list[float]:
        rewards = exact_match_reward(completions, answer)
        self.batches.append(rewards)
        return rewards


def lower_tail_rvar(rewards: list[float], cfg: ToyConfig, seed: int) -> float:
    """Mean bundle score in the lower ``risk_alpha`` tail of one batch: RiskPO's ``risk/lower_rvar`` statistic, but
    with the batch's empirical ``alpha``-quantile instead of the tracked one, so it is computed identically for all
    methods (bundles of ``bundle_size`` prompts drawn by ``permutation_bundles`` with a fixed seed)."""
    from riskpo_trl.risk import empirical_quantiles, permutation_bundles

    scores, _ = permutation_bundles(
        torch.tensor(rewards), cfg.num_generations, cfg.bundle_size, torch.Generator().manual_seed(seed)
    )
    q_alpha = empirical_quantiles(scores, [cfg.risk_alpha])[0]
    return scores[scores <= q_alpha].mean().item()


def rl_config(method: str, seed: int, cfg: ToyConfig, output_dir: Path):
    """The same GRPO settings for every method; RiskPO adds only its risk fields."""
    from trl import GRPOConfig

    from riskpo_trl import RiskPOConfig

    common = {
        "output_dir": str(output_dir),
        "max_steps": cfg.rl_steps,
        "learning_rate": cfg.rl_lr,
        "lr_scheduler_type": "constant",
        "num_generations": cfg.num_generations,
        "per_device_train_batch_size": cfg.num_generations * cfg.prompts_per_step,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,  # one update per generation batch for every method (RiskPOConfig's default is 4)
        "max_completion_length": cfg.max_completion_length,
        "temperature": cfg.temperature,
        "top_k": 0,
        "top_p": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
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
    if method == "riskpo_authors":  # the public code's per-group quantiles and scaled advantage, w_mix = 1.5
        return RiskPOConfig(**common, bundle_size=cfg.bundle_size, risk_alpha=cfg.risk_alpha, risk_omega=1.5,
                            quantile_source="group", advantage_scaling="authors_code")
    profile = {"riskpo": "mvar", "risk_seeking": "risk_seeking"}[method]
    return RiskPOConfig(**common, bundle_size=cfg.bundle_size, risk_profile=profile, risk_alpha=cfg.risk_alpha)


def run_rl(method: str, seed: int, cfg: ToyConfig, out_dir: Path) -> dict[str, Any]:
    """One RL run from the SFT checkpoint; returns (and writes) its curves and held-out evaluation."""
    from trl import GRPOTrainer

    from riskpo_trl import RiskPOTrainer

    splits = make_splits(cfg)
    recorder = RewardRecorder()
    args = rl_config(method, seed, cfg, out_dir / "rl_runs" / f"{method}-seed{seed}")
    trainer_cls = GRPOTrainer if method == "grpo" else RiskPOTrainer
    trainer = trainer_cls(
        model=str(out_dir / "sft_model"), reward_funcs=recorder, args=args, train_dataset=rl_dataset(splits.train)
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [entry for entry in trainer.state.log_history if "entropy" in entry]
    curves = {
        "step": [entry["step"] for entry in logs],
        "reward": [entry.get("reward") for entry in logs],
        "entropy": [entry.get("entropy") for entry in logs],
        "lower_rvar_posthoc": [lower_tail_rvar(r, cfg, seed=i) for i, r in enumerate(recorder.batches)],
    }
    if method != "grpo":
        curves["risk/lower_rvar"] = [entry.get("risk/lower_rvar") for entry in logs]
    counts = sample_correct_counts(trainer.model, trainer.processing_class, splits.test, cfg.eval_samples, cfg, seed=0)
    result = {
        "method": method,
        "seed": seed,
        "seconds": seconds,
        "curves": curves,
        "test": pass_at_ks(counts, cfg.eval_samples, cfg.ks),
    }
    path = out_dir / "rl_runs" / f"{method}-seed{seed}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[rl] {method} seed {seed}: {seconds:.0f}s, held-out {result['test']}", flush=True)
    return result


# --- report ------------------------------------------------------------------------------------------------------


def _tail_mean(values: list[float], fraction: float = 0.25) -> float:
    """Mean of the last ``fraction`` of a curve (end-of-training level, less noisy than the last point)."""
    values = [v for v in values if v is not None]
    tail = values[-max(1, int(len(values) * fraction)) :]
    return sum(tail) / len(tail)


def summarize(cfg: ToyConfig, out_dir: Path) -> dict[str, Any]:
    sft = json.loads((out_dir / "sft_summary.json").read_text())
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    for method in METHODS:
        for seed in cfg.seeds:
            path = out_dir / "rl_runs" / f"{method}-seed{seed}.json"
            if path.exists():
                runs[method].append(json.loads(path.read_text()))
    table = {}
    for method, results in runs.items():
        if not results:
            continue
        row = {key: mean_std([r["test"][key] for r in results]) for key in results[0]["test"]}
        for curve in ("entropy", "reward", "lower_rvar_posthoc"):
            row[f"final_{curve}"] = mean_std([_tail_mean(r["curves"][curve]) for r in results])
        row["mean_entropy"] = mean_std([sum(r["curves"]["entropy"]) / len(r["curves"]["entropy"]) for r in results])
        row["seeds"] = [r["seed"] for r in results]
        row["seconds_per_run"] = mean_std([r["seconds"] for r in results])
        table[method] = row
    return {"config": asdict(cfg), "sft": sft, "methods": table, "runs": runs}


def _markdown(summary: dict[str, Any], machine: dict[str, Any]) -> str:
    cfg, sft = summary["config"], summary["sft"]
    ks = cfg["ks"]
    lines = [
        "# Toy replication: GRPO vs RiskPO vs risk-seeking (2-digit addition, CPU)",
        "",
        f"Starting point: SFT for {sft['steps']} steps; held-out "
        + ", ".join(f"Pass@{k} {sft['test'][f'pass@{k}']:.3f}" for k in ks),
        (
            f"RL: {cfg['rl_steps']} steps x {cfg['prompts_per_step']} prompts x {cfg['num_generations']} completions, "
            f"seeds {list(cfg['seeds'])}; values are mean ± std over seeds."
        ),
        "",
        "| method | " + " | ".join(f"Pass@{k}" for k in ks) + " | entropy (mean) | entropy (last 25%) | "
        "reward (last 25%) | lower RVaR (last 25%) |",
        "|---" * (len(ks) + 5) + "|",
    ]
    for method, row in summary["methods"].items():
        cells = [f"{m:.3f} ± {s:.3f}" for m, s in (row[f"pass@{k}"] for k in ks)]
        cells += [
            f"{row[key][0]:.3f} ± {row[key][1]:.3f}"
            for key in ("mean_entropy", "final_entropy", "final_reward", "final_lower_rvar_posthoc")
        ]
        lines.append(f"| {METHOD_LABELS[method]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        (
            f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, torch {machine['torch']}, "
            f"trl {machine['trl']}."
        ),
    ]
    return "\n".join(lines)


def _smooth(values, window: int):
    """Trailing moving average (shorter at the start), so per-step noise does not hide the trend."""
    import numpy as np

    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumsum[1:] - cumsum[np.maximum(np.arange(1, len(values) + 1) - window, 0)]) / counts


def plot(summary: dict[str, Any], out_dir: Path, window: int = 10) -> list[Path]:
    """Training curves (reward, entropy, lower-tail RVaR; trailing ``window``-step average of the seeds' mean, band =
    ± std over seeds) and Pass@k (mean ± std over seeds), like the paper's figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for method, results in summary["runs"].items():
        if not results:
            continue
        for ax, key, title in zip(
            axes,
            ("reward", "entropy", "lower_rvar_posthoc"),
            ("mean reward", "entropy", f"lower-tail RVaR (alpha={summary['config']['risk_alpha']})"),
        ):
            curves = np.array([r["curves"][key] for r in results], dtype=float)
            steps = np.arange(1, curves.shape[1] + 1)
            mean, std = _smooth(curves.mean(0), window), _smooth(curves.std(0), window)
            ax.plot(steps, mean, label=METHOD_LABELS[method])
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
            ax.set_title(f"{title}, {window}-step avg")
            ax.set_xlabel("RL step")
    axes[0].legend()
    fig.tight_layout()
    paths.append(out_dir / "toy_training_curves.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    ks = summary["config"]["ks"]
    sft = summary["sft"]["test"]
    ax.plot(ks, [sft[f"pass@{k}"] for k in ks], "k--", label="SFT start")
    for method, row in summary["methods"].items():
        mean = np.array([row[f"pass@{k}"][0] for k in ks])
        std = np.array([row[f"pass@{k}"][1] for k in ks])
        ax.errorbar(ks, mean, yerr=std, marker="o", capsize=3, label=METHOD_LABELS[method])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("Pass@k (held-out)")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "toy_pass_at_k.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)
    return paths


def report(cfg: ToyConfig, out_dir: Path) -> dict[str, Any]:
    summary = summarize(cfg, out_dir)
    machine = machine_info()
    markdown = _markdown(summary, machine)
    write_results("toy_replication", {"machine": machine, **summary}, markdown, out_dir)
    plot(summary, out_dir)
    print(markdown)
    return summary


# --- CLI ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("sft", "rl", "report", "all"))
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Where models, runs and results go (default: benchmarks/results/toy, or toy-smoke with "
        "--smoke, so a smoke run never overwrites real results).",
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, help="Override the seeds (default: ToyConfig.seeds).")
    parser.add_argument(
        "--smoke", action="store_true", help="Minimal sizes for a smoke test; numbers are meaningless."
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads. 1 is fastest for this tiny model and robust on a shared machine.",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    cfg = ToyConfig().scaled_down() if args.smoke else ToyConfig()
    args.out = args.out or RESULTS_DIR / ("toy-smoke" if args.smoke else "toy")
    if args.seeds:
        cfg = replace(cfg, seeds=tuple(args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.command in ("sft", "all"):
        run_sft(cfg, args.out)
    if args.command in ("rl", "all"):
        for seed in cfg.seeds:  # seed-major order: a partial run still has every method for the first seeds
            for method in args.methods:
                run_rl(method, seed, cfg, args.out)
    if args.command in ("report", "all"):
        report(cfg, args.out)
    print(f"[toy] {args.command} took {time.perf_counter() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
