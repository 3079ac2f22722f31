"""The SFT start shared by every RL run: TRL's ``SFTTrainer`` on fresh task pairs, stopped by a fixed rule."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import LMConfig
from .evaluation import evaluate
from .task import Splits, make_splits, prompt_of, sft_pairs


def run_sft(cfg: LMConfig, out_dir: Path) -> dict[str, Any]:
    """Train the shared start with TRL's SFTTrainer and save it under ``out_dir / "models" / "sft"``."""
    summary_path = out_dir / "sft_summary.json"
    sft_dir = out_dir / "models" / "sft"
    if summary_path.exists() and (sft_dir / "config.json").exists():
        return json.loads(summary_path.read_text())
    from transformers import TrainerCallback

    splits = make_splits(cfg)
    init_dir = out_dir / "models" / "init"
    build_init_model(cfg, init_dir)
    history: list[dict[str, Any]] = []
    easy = min(cfg.digits)
    check_cfg = replace(cfg, eval_samples=min(cfg.eval_samples, 16))

    class StopWhenEasySolved(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % cfg.sft_eval_every:
                return
            val = evaluate(model, processing_class, splits.val, check_cfg)
            model.train()
            entry = {
                "step": state.global_step,
                **{
                    b: {k: v for k, v in r.items() if k in ("pass@1", "pass@16", f"pass@{check_cfg.ks[-1]}")}
                    for b, r in val.items()
                },
            }
            history.append(entry)
            print(f"[sft] step {state.global_step}: {entry}", flush=True)
            if val[f"{easy}digit"][f"pass@{check_cfg.ks[-1]}"] >= cfg.sft_target_easy_pass16:
                control.should_training_stop = True

    trainer = sft_trainer(
        cfg,
        splits,
        init_dir,
        out_dir / "models" / "sft_run",
        max_steps=cfg.sft_max_steps,
        seed=0,
        callback=StopWhenEasySolved(),
    )
    tokenizer = trainer.processing_class
    start = time.perf_counter()
    trainer.train()
    trainer.save_model(str(sft_dir))
    splits_eval = {
        "val": evaluate(trainer.model, tokenizer, splits.val, cfg),
        "test": evaluate(trainer.model, tokenizer, splits.test, cfg),
    }
    summary = {
        "steps": trainer.state.global_step,
        "seconds": time.perf_counter() - start,
        "history": history,
        **splits_eval,
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[sft] saved after {summary['steps']} steps; test {summary['test']}", flush=True)
    return summary


def build_init_model(cfg: LMConfig, init_dir: Path) -> None:
    """The random-weight model every SFT start begins from: ``cfg``'s sizes, seed 0, saved in ``init_dir``."""
    from riskpo_trl.tiny_model import build_tiny_model

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


def sft_trainer(cfg: LMConfig, splits: Splits, base_dir: Path, run_dir: Path, *, max_steps: int, seed: int, callback):
    """TRL's ``SFTTrainer`` from ``base_dir`` on the task's fresh pairs (:func:`~.task.sft_pairs`, never a
    validation or test problem), with :func:`sft_args` and one callback, the stopping rule."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    pairs = sft_pairs(cfg, splits, per_bucket=cfg.sft_pairs_per_bucket)
    train = Dataset.from_list([{"prompt": prompt_of(a, b), "completion": str(a + b)} for a, b in pairs])
    return SFTTrainer(
        model=str(base_dir),
        args=sft_args(cfg, run_dir, max_steps=max_steps, seed=seed),
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(base_dir),
        callbacks=[callback],
    )


def sft_args(cfg: LMConfig, output_dir: Path, *, max_steps: int, seed: int):
    """The SFT settings of every start: constant learning rate, whole-batch steps, no checkpoints."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_lr,
        lr_scheduler_type="constant",
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=seed,
        dataloader_drop_last=True,
        max_length=32,
        disable_tqdm=True,
    )


def continue_sft(
    cfg: LMConfig,
    base_dir: Path,
    out_dir: Path,
    *,
    bucket: int,
    target_pass1: float,
    check_every: int,
    check_samples: int,
    max_steps: int,
) -> dict[str, Any]:
    """A second start in a higher-success regime: continue the SFT of ``base_dir`` (same pairs, learning rate and
    batch size, a new data order) until the ``bucket``-digit validation Pass@1 reaches ``target_pass1`` (checked every
    ``check_every`` steps with ``check_samples`` samples), or for ``max_steps`` steps. Saved under
    ``out_dir / "models" / "sft"``; ``sft_summary.json`` records whether the target was reached."""
    summary_path = out_dir / "sft_summary.json"
    sft_dir = out_dir / "models" / "sft"
    if summary_path.exists() and (sft_dir / "config.json").exists():
        return json.loads(summary_path.read_text())
    from transformers import TrainerCallback

    splits = make_splits(cfg)
    check_cfg = replace(cfg, eval_samples=check_samples, ks=(1,))
    history: list[dict[str, Any]] = []

    class StopAtTarget(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % check_every:
                return
            val = evaluate(model, processing_class, splits.val, check_cfg)
            model.train()
            history.append({"step": state.global_step, **{b: r["pass@1"] for b, r in val.items()}})
            print(f"[sft-continue] step {state.global_step}: {history[-1]}", flush=True)
            if val[f"{bucket}digit"]["pass@1"] >= target_pass1:
                control.should_training_stop = True

    trainer = sft_trainer(
        cfg, splits, base_dir, out_dir / "models" / "sft_run", max_steps=max_steps, seed=1, callback=StopAtTarget()
    )
    start = time.perf_counter()
    trainer.train()
    trainer.save_model(str(sft_dir))
    reached = bool(history) and history[-1][f"{bucket}digit"] >= target_pass1
    summary = {
        "base": str(base_dir.name),
        "extra_steps": trainer.state.global_step,
        "reached_target": reached,
        "rule": f"{bucket}digit validation Pass@1 >= {target_pass1} ({check_samples} samples), checked every "
        f"{check_every} steps, at most {max_steps} steps",
        "seconds": time.perf_counter() - start,
        "history": history,
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[sft-continue] saved after {summary['extra_steps']} more steps; target reached: {reached}", flush=True)
    return summary
