"""What RiskPO costs on top of GRPO: step time and peak memory of ``RiskPOTrainer`` vs ``trl.GRPOTrainer``.

    python -m benchmarks.overhead                                   # tiny CPU model (build_tiny_model)
    python -m benchmarks.overhead --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --max-completion-length 256

Both trainers get the same model, prompts, reward, seed, batch layout and loss settings
(``importance_sampling_level="sequence"``, ``loss_type="grpo"``, ``beta=0``); only the advantage differs. Every run is
a fresh subprocess, so its peak memory (RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU) is its own, and runs
alternate GRPO/RiskPO in ABBA order to cancel slow drift of the machine's speed. Step time is the median of per-step
wall times after ``--warmup`` steps; ratios are RiskPO / GRPO, so 1.00 means no overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET_RATIO = 1.02
TRAINERS = ("grpo", "riskpo")


def digit_reward(completions, **kwargs) -> list[float]:
    """Binary reward that a random tiny model earns part of the time: does the completion contain a digit?"""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in text)) for text in texts]


def prompts(num_prompts: int):
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}]} for i in range(num_prompts)]
    )


# --- one run (subprocess) ----------------------------------------------------------------------------------------


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.steps`` steps with one trainer and measure it; runs inside its own process."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from riskpo_trl import RiskPOConfig, RiskPOTrainer

    torch.set_num_threads(args.threads)
    on_gpu = args.device.startswith("cuda")

    def clocks() -> tuple[float, float]:
        # Wall time, and this process's CPU time: the latter barely moves when other processes share the cores.
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self._start = (0.0, 0.0)

        def on_step_begin(self, *a, **k):
            self._start = clocks()

        def on_step_end(self, *a, **k):
            end = clocks()
            self.wall.append(end[0] - self._start[0])
            self.cpu.append(end[1] - self._start[1])

    class TimedGRPO(GRPOTrainer):
        """Times GRPO's own generation-and-scoring, so RiskPO's additions around it can be measured."""

        inner: list[tuple[float, float]]

        def _generate_and_score_completions(self, inputs):
            start = clocks()
            output = super()._generate_and_score_completions(inputs)
            end = clocks()
            self.inner.append((end[0] - start[0], end[1] - start[1]))
            return output

    class TimedRiskPO(RiskPOTrainer, TimedGRPO):
        """MRO: TimedRiskPO -> RiskPOTrainer -> TimedGRPO -> GRPOTrainer. The outer time minus the inner one is
        exactly what RiskPO adds per generation batch (bundling, tracker, advantages, metrics, logging)."""

        outer: list[tuple[float, float]]

        def _generate_and_score_completions(self, inputs):
            start = clocks()
            output = super()._generate_and_score_completions(inputs)
            end = clocks()
            self.outer.append((end[0] - start[0], end[1] - start[1]))
            return output

    num_prompts_per_step = args.prompts_per_step
    common = {
        "output_dir": args.output_dir,
        "max_steps": args.steps,
        "learning_rate": 1e-5,
        "seed": args.seed,
        "num_generations": args.num_generations,
        "per_device_train_batch_size": args.num_generations * num_prompts_per_step,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,  # one update per generation batch for both trainers (RiskPOConfig's default is 4)
        "max_completion_length": args.max_completion_length,
        "temperature": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": not on_gpu,
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    if args.worker == "grpo":
        config, trainer_cls = GRPOConfig(**common), TimedGRPO
    else:
        config, trainer_cls = RiskPOConfig(**common, bundle_size=args.bundle_size), TimedRiskPO
    timer = StepTimer()
    trainer = trainer_cls(
        model=args.model,
        reward_funcs=digit_reward,
        args=config,
        train_dataset=prompts(num_prompts_per_step * args.steps),
        callbacks=[timer],
    )
    trainer.inner, trainer.outer = [], []
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    rss_before_train = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trainer.train()
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    result = {
        "trainer": args.worker,
        "step_times_s": timer.wall,
        "step_cpu_times_s": timer.cpu,
        "median_step_s": statistics.median(timer.wall[args.warmup :]),
        "median_step_cpu_s": statistics.median(timer.cpu[args.warmup :]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux reports KiB
        "peak_rss_before_train_mib": rss_before_train / 1024,
        "mean_completion_length": statistics.fmean(lengths) if lengths else None,
    }
    if trainer.outer:
        added = [(o[0] - i[0], o[1] - i[1]) for o, i in zip(trainer.outer, trainer.inner)][args.warmup :]
        result["median_riskpo_added_s"] = statistics.median(a[0] for a in added)
        result["median_riskpo_added_cpu_s"] = statistics.median(a[1] for a in added)
    if on_gpu:
        result["peak_cuda_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


# --- driver ------------------------------------------------------------------------------------------------------


def abba_order(pairs: int) -> list[str]:
    """GRPO, RiskPO, RiskPO, GRPO, ... : each trainer equally often first and second, so linear drift cancels."""
    order: list[str] = []
    for i in range(pairs):
        order += list(TRAINERS) if i % 2 == 0 else list(reversed(TRAINERS))
    return order


def ratio_summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Median of the per-run values of each trainer and their ratio RiskPO / GRPO."""
    per_run = {t: [r[key] for r in runs if r["trainer"] == t] for t in TRAINERS}
    medians = {t: statistics.median(values) for t, values in per_run.items()}
    return {
        "grpo": medians["grpo"],
        "riskpo": medians["riskpo"],
        "ratio": medians["riskpo"] / medians["grpo"],
        "per_run": per_run,
    }


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks._common import machine_info, write_results

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from riskpo_trl.tiny_model import build_tiny_model

            model = os.path.join(tmp, "tiny-model")
            build_tiny_model(model)
        runs = []
        for index, trainer in enumerate(abba_order(args.pairs)):
            out_json = os.path.join(tmp, f"run{index}.json")
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.overhead",
                "--worker",
                trainer,
                "--worker-out",
                out_json,
                "--model",
                model,
                "--output-dir",
                os.path.join(tmp, f"run{index}"),
                *forwarded_flags(args),
            ]
            subprocess.run(
                cmd,
                check=True,
                cwd=Path(__file__).resolve().parent.parent,
                stdout=subprocess.DEVNULL if not args.verbose else None,
            )
            runs.append(json.loads(Path(out_json).read_text()))
            print(
                f"[overhead] run {index + 1}/{2 * args.pairs} {trainer}: median step "
                f"{1e3 * runs[-1]['median_step_s']:.1f} ms wall, {1e3 * runs[-1]['median_step_cpu_s']:.1f} ms CPU, "
                f"peak RSS {runs[-1]['peak_rss_mib']:.0f} MiB",
                flush=True,
            )

    summary = {
        "step_time_s": ratio_summary(runs, "median_step_s"),
        "step_cpu_time_s": ratio_summary(runs, "median_step_cpu_s"),
        "peak_rss_mib": ratio_summary(runs, "peak_rss_mib"),
    }
    riskpo_runs = [r for r in runs if r["trainer"] == "riskpo"]
    added_cpu = statistics.median(r["median_riskpo_added_cpu_s"] for r in riskpo_runs)
    summary["riskpo_added_per_step"] = {
        "wall_s": statistics.median(r["median_riskpo_added_s"] for r in riskpo_runs),
        "cpu_s": added_cpu,
        "fraction_of_grpo_step_cpu": added_cpu / summary["step_cpu_time_s"]["grpo"],
    }
    if "peak_cuda_allocated_mib" in runs[0]:
        summary["peak_cuda_allocated_mib"] = ratio_summary(runs, "peak_cuda_allocated_mib")
    settings = {k: v for k, v in vars(args).items() if k not in ("worker", "worker_out", "output_dir", "verbose")}
    settings["model"] = args.model or "build_tiny_model() defaults"
    lines = [
        f"# RiskPO vs GRPO overhead ({settings['model']}, {args.device}, {args.threads} thread(s))",
        "",
        (
            f"{2 * args.pairs} runs in ABBA order, {args.steps} steps each, median per-step time after {args.warmup} "
            f"warm-up steps; {args.prompts_per_step} prompts x {args.num_generations} completions per step, "
            f"max_completion_length={args.max_completion_length}."
        ),
        "",
        "| measure | GRPO | RiskPO | ratio RiskPO/GRPO |",
        "|---|---:|---:|---:|",
        (
            f"| step time (ms) | {1e3 * summary['step_time_s']['grpo']:.1f} | "
            f"{1e3 * summary['step_time_s']['riskpo']:.1f} | {summary['step_time_s']['ratio']:.3f} |"
        ),
        (
            f"| step CPU time (ms) | {1e3 * summary['step_cpu_time_s']['grpo']:.1f} | "
            f"{1e3 * summary['step_cpu_time_s']['riskpo']:.1f} | {summary['step_cpu_time_s']['ratio']:.3f} |"
        ),
        (
            f"| peak RSS (MiB) | {summary['peak_rss_mib']['grpo']:.0f} | {summary['peak_rss_mib']['riskpo']:.0f} "
            f"| {summary['peak_rss_mib']['ratio']:.3f} |"
        ),
    ]
    if "peak_cuda_allocated_mib" in summary:
        cuda = summary["peak_cuda_allocated_mib"]
        lines.append(
            f"| peak CUDA allocated (MiB) | {cuda['grpo']:.0f} | {cuda['riskpo']:.0f} | {cuda['ratio']:.3f} |"
        )
    added = summary["riskpo_added_per_step"]
    lines += [
        "",
        "Per-run median step CPU time (ms), in run order per trainer: "
        + "; ".join(
            f"{t}: " + ", ".join(f"{1e3 * v:.0f}" for v in summary["step_cpu_time_s"]["per_run"][t]) for t in TRAINERS
        )
        + ".",
        "",
        (
            f"Measured inside the RiskPO runs: RiskPO's own work per step (bundling, tracker, advantages, metrics and "
            f"logging around GRPO's generate-and-score) costs {1e3 * added['cpu_s']:.2f} ms CPU "
            f"({1e3 * added['wall_s']:.2f} ms wall), {100 * added['fraction_of_grpo_step_cpu']:.2f}% of a GRPO step's "
            "CPU time."
        ),
        "",
        (
            f"Target: step-time ratio <= {TARGET_RATIO}. Wall times move with other load on the machine; CPU time "
            "(time.process_time, one torch thread) is the steadier measure of the work each trainer does."
        ),
    ]
    markdown = "\n".join(lines)
    payload = {"machine": machine_info(), "settings": settings, "summary": summary, "runs": runs}
    name = "overhead" if args.device == "cpu" and args.model is None else f"overhead_{args.device.split(':')[0]}"
    write_results(name, payload, markdown, args.out)
    print(markdown)
    return payload


def forwarded_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--num-generations",
        str(args.num_generations),
        "--prompts-per-step",
        str(args.prompts_per_step),
        "--bundle-size",
        str(args.bundle_size),
        "--max-completion-length",
        str(args.max_completion_length),
        "--seed",
        str(args.seed),
    ]
    return flags + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Model id or path; default: a fresh build_tiny_model().")
    parser.add_argument("--device", default="cpu", help="'cpu' or 'cuda'.")
    parser.add_argument("--pairs", type=int, default=3, help="GRPO/RiskPO run pairs (ABBA order).")
    parser.add_argument("--steps", type=int, default=15, help="Optimizer steps per run.")
    parser.add_argument("--warmup", type=int, default=3, help="Leading steps left out of the median.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per run.")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=5, help="A multiple of --bundle-size.")
    parser.add_argument("--bundle-size", type=int, default=5)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="For large models on GPU.")
    parser.add_argument("--out", default=None, help="Results directory (default: benchmarks/results).")
    parser.add_argument("--verbose", action="store_true", help="Show the runs' training logs.")
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error(f"--warmup ({args.warmup}) must be smaller than --steps ({args.steps}).")
    if args.prompts_per_step % args.bundle_size:
        parser.error(
            f"--prompts-per-step ({args.prompts_per_step}) must be a multiple of --bundle-size ({args.bundle_size})."
        )
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        result = run_worker(args)
        Path(args.worker_out).write_text(json.dumps(result))
        return result
    return run_comparison(args)


if __name__ == "__main__":
    main()
