"""What RiskPO costs on top of GRPO: step time and peak memory of ``RiskPOTrainer`` vs ``trl.GRPOTrainer`` (both as
``riskpo-train`` builds them: the registry's class, built by the job layer; TRL's GRPOTrainer observed through
``riskpo_trl.trainer.observed.observed_trainer``, the same per-batch seam RiskPO's trainer has).

    python -m benchmarks.overhead                                   # tiny CPU model (build_tiny_model)
    python -m benchmarks.overhead --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --max-completion-length 256

Both trainers get the same model, prompts, reward, seed, batch layout and loss settings
(``importance_sampling_level="sequence"``, ``loss_type="grpo"``, ``beta=0``); only the advantage differs. Every run is
a fresh subprocess, so its peak memory (RSS on CPU, ``torch.cuda.max_memory_allocated`` on GPU) is its own, and runs
alternate GRPO/RiskPO in ABBA order to cancel slow drift of the machine's speed. Step time is the median of per-step
wall times after ``--warmup`` steps; ratios are RiskPO / GRPO, so 1.00 means no overhead, given both as the ratio of
the trainers' medians and as the median of the per-pair ratios. RiskPO's own work per generation batch is read from
the public seams only: each run times the interval from its reward function's return to its batch observer (TRL's
work after scoring, the same in both trainers, plus RiskPO's advantage step); RiskPO's share is the difference of
the two trainers' medians.

For a ratio that resolves small differences, ``--fixed-length`` makes every completion exactly
``--max-completion-length`` tokens long, so every run does the same work; each step's optimisation phase (from the
batch observer to the step's end: loss, backward, optimizer step) is timed on its own as well; each measure gets the
geometric mean of its pair ratios with a 95% interval; and ``--size-after N`` runs only as many pairs as the first N
pairs' spread needs for a ±2% interval (``benchmarks.pair_design``), at most ``--pairs``.

On a GPU, ``--in-process`` runs the trainers one after another in this process instead (it saves an interpreter and
the imports per run, which matters when device time is short): each run's peak is then
``torch.cuda.max_memory_allocated`` minus what was allocated when it began, and RSS is left out. ``--deadline``
(seconds since the epoch) stops before a pair that would not finish in time, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
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

from benchmarks.pair_design import describe_interval, log_ratio_spread, pairs_needed, ratio_interval

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

    from riskpo_trl import job
    from riskpo_trl.trainer.observed import observed_trainer
    from riskpo_trl.trainer.registry import get_trainer_classes

    torch.set_num_threads(args.threads)
    on_gpu = args.device.startswith("cuda")

    def clocks() -> tuple[float, float]:
        # Wall time, and this process's CPU time: the latter barely moves when other processes share the cores.
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter(), time.process_time()

    observed_at: list[tuple[float, float]] = []  # when the batch observer ran, per generation batch

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.wall: list[float] = []
            self.cpu: list[float] = []
            self.optimisation: list[float] = []  # from the batch observer to the step's end: loss, backward, step
            self._start = (0.0, 0.0)

        def on_step_begin(self, *a, **k):
            self._start = clocks()

        def on_step_end(self, *a, **k):
            end = clocks()
            self.wall.append(end[0] - self._start[0])
            self.cpu.append(end[1] - self._start[1])
            if observed_at and observed_at[-1][0] >= self._start[0]:  # this step generated its own batch
                self.optimisation.append(end[0] - observed_at[-1][0])

    scored_at: list[tuple[float, float]] = []  # when the reward function returned, per generation batch
    after_scoring: list[tuple[float, float]] = []  # from then to the batch observer

    def timed_reward(completions, **kwargs) -> list[float]:
        rewards = digit_reward(completions)
        scored_at.append(clocks())
        return rewards

    def observe(batch) -> None:
        end, start = clocks(), scored_at[-1]
        after_scoring.append((end[0] - start[0], end[1] - start[1]))
        observed_at.append(end)

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
    if args.fixed_length:  # every completion max_completion_length tokens long, so every run does the same work
        common["generation_kwargs"] = {"min_new_tokens": args.max_completion_length}
    config_class, trainer_class = get_trainer_classes(args.worker)
    if not hasattr(trainer_class, "add_batch_observer"):  # TRL's own baseline: the seam for the timing only
        trainer_class = observed_trainer(trainer_class)
    risk = {"bundle_size": args.bundle_size} if args.worker == "riskpo" else {}
    timer = StepTimer()
    trainer = job.build(
        trainer_class,
        model=args.model,
        reward_funcs=timed_reward,
        args=config_class(**common, **risk),
        train_dataset=prompts(num_prompts_per_step * args.steps),
        callbacks=[timer],
    )
    trainer.add_batch_observer(observe)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        allocated_at_start = args.allocated_at_start or 0  # in-process runs: what earlier runs left allocated
    rss_before_train = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trainer.train()
    lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
    completions_per_step = args.num_generations * num_prompts_per_step
    result = {
        "trainer": args.worker,
        "step_times_s": timer.wall,
        "step_cpu_times_s": timer.cpu,
        "median_step_s": statistics.median(timer.wall[args.warmup :]),
        "median_step_cpu_s": statistics.median(timer.cpu[args.warmup :]),
        "optimisation_times_s": timer.optimisation,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux reports KiB
        "peak_rss_before_train_mib": rss_before_train / 1024,
        "mean_completion_length": statistics.fmean(lengths) if lengths else None,
        "model_dtype": str(trainer.model.dtype),
    }
    if lengths:  # completion tokens generated and trained on per second of a whole step
        result["completion_tokens_per_s"] = statistics.fmean(lengths) * completions_per_step / result["median_step_s"]
    if len(timer.optimisation) == len(timer.wall):
        result["median_optimisation_s"] = statistics.median(timer.optimisation[args.warmup :])
    kept = after_scoring[args.warmup :] or after_scoring
    result["median_after_scoring_s"] = statistics.median(a[0] for a in kept)
    result["median_after_scoring_cpu_s"] = statistics.median(a[1] for a in kept)
    if on_gpu:
        result["peak_cuda_allocated_mib"] = (torch.cuda.max_memory_allocated() - allocated_at_start) / 2**20
        result["cuda_allocated_before_run_mib"] = allocated_at_start / 2**20
    return result


# --- driver ------------------------------------------------------------------------------------------------------


def abba_order(pairs: int) -> list[str]:
    """GRPO, RiskPO, RiskPO, GRPO, ... : each trainer equally often first and second, so linear drift cancels."""
    order: list[str] = []
    for i in range(pairs):
        order += list(TRAINERS) if i % 2 == 0 else list(reversed(TRAINERS))
    return order


def ratio_summary(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median of the per-run values of each trainer, their ratio RiskPO / GRPO, and the median of the ratios within
    each consecutive GRPO/RiskPO pair (runs 1-2, 3-4, ...)."""
    per_run = {t: [r[key] for r in runs if r["trainer"] == t] for t in TRAINERS}
    medians = {t: statistics.median(values) for t, values in per_run.items()}
    pairs = [{r["trainer"]: r[key] for r in runs[i : i + 2]} for i in range(0, len(runs) - 1, 2)]
    pair_ratios = [p["riskpo"] / p["grpo"] for p in pairs if set(p) == set(TRAINERS)]
    return {
        "grpo": medians["grpo"],
        "riskpo": medians["riskpo"],
        "ratio": medians["riskpo"] / medians["grpo"],
        "pair_ratios": pair_ratios,
        "median_pair_ratio": statistics.median(pair_ratios),
        "interval": ratio_interval(pair_ratios),
        "per_run": per_run,
    }


def run_in_process(args: argparse.Namespace, trainer: str, model: str, output_dir: str) -> dict[str, Any]:
    """One run in this process; afterwards its trainer and model are freed, so the next run's peak is its own."""
    import torch

    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    worker_args = parse_args(
        ["--worker", trainer, "--model", model, "--output-dir", output_dir, *forwarded_flags(args)]
    )
    worker_args.allocated_at_start = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0
    with contextlib.nullcontext() if args.verbose else contextlib.redirect_stdout(io.StringIO()):  # its log lines
        result = run_worker(worker_args)
    gc.collect()
    return result


def run_in_subprocess(args: argparse.Namespace, trainer: str, model: str, output_dir: str) -> dict[str, Any]:
    out_json = output_dir + ".json"
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
        output_dir,
        *forwarded_flags(args),
    ]
    subprocess.run(
        cmd,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL if not args.verbose else None,
    )
    return json.loads(Path(out_json).read_text())


def run_pairs(args: argparse.Namespace, model: str, tmp: str) -> tuple[list, list, str | None, dict | None]:
    """The runs in ABBA order until the pairs are done, the pilot pairs' sizing says enough, or the deadline nears:
    the runs, their seconds, why they stopped early and the sizing (None where neither applied)."""
    runs, run_seconds, stopped, sizing = [], [], None, None
    wanted = args.pairs
    on_cuda = args.device.startswith("cuda")
    run_one = run_in_process if args.in_process else run_in_subprocess
    for index, trainer in enumerate(abba_order(args.pairs)):
        if index % 2 == 0 and args.size_after and index // 2 == args.size_after:
            sizing = size_from_pilot(runs, args.pairs)
            wanted = sizing["pairs_wanted"]
            print(f"[overhead] {sizing['note']}", flush=True)
        if index // 2 >= wanted:
            break
        if index % 2 == 0 and run_seconds and args.deadline is not None:
            if time.time() + 2 * max(run_seconds) > args.deadline:
                stopped = f"stopped after {index // 2} of {args.pairs} pairs: the next pair would pass the deadline"
                print(f"[overhead] {stopped}", flush=True)
                break
        started = time.time()
        runs.append(run_one(args, trainer, model, os.path.join(tmp, f"run{index}")))
        run_seconds.append(time.time() - started)
        print(
            f"[overhead] run {index + 1}/{2 * args.pairs} {trainer}: median step "
            f"{1e3 * runs[-1]['median_step_s']:.1f} ms wall, {1e3 * runs[-1]['median_step_cpu_s']:.1f} ms CPU, "
            f"peak RSS {runs[-1]['peak_rss_mib']:.0f} MiB"
            + (f", peak CUDA {runs[-1]['peak_cuda_allocated_mib']:.0f} MiB" if on_cuda else ""),
            flush=True,
        )
    return runs, run_seconds, stopped, sizing


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks._common import machine_info, write_results

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from riskpo_trl.tiny_model import build_tiny_model

            model = os.path.join(tmp, "tiny-model")
            build_tiny_model(model)
        runs, run_seconds, stopped, sizing = run_pairs(args, model, tmp)

    summary = {
        "step_time_s": ratio_summary(runs, "median_step_s"),
        "step_cpu_time_s": ratio_summary(runs, "median_step_cpu_s"),
    }
    if all("median_optimisation_s" in r for r in runs):
        summary["optimisation_time_s"] = ratio_summary(runs, "median_optimisation_s")
    if not args.in_process:  # in one process the RSS peak is the whole sequence's, not a run's
        summary["peak_rss_mib"] = ratio_summary(runs, "peak_rss_mib")
    after_scoring = ratio_summary(runs, "median_after_scoring_s")
    after_scoring_cpu = ratio_summary(runs, "median_after_scoring_cpu_s")
    added_cpu = after_scoring_cpu["riskpo"] - after_scoring_cpu["grpo"]
    summary["riskpo_added_per_step"] = {
        "wall_s": after_scoring["riskpo"] - after_scoring["grpo"],
        "cpu_s": added_cpu,
        "fraction_of_grpo_step_cpu": added_cpu / summary["step_cpu_time_s"]["grpo"],
        "after_scoring_s": after_scoring,
        "after_scoring_cpu_s": after_scoring_cpu,
    }
    if "peak_cuda_allocated_mib" in runs[0]:
        summary["peak_cuda_allocated_mib"] = ratio_summary(runs, "peak_cuda_allocated_mib")
    if all("completion_tokens_per_s" in r for r in runs):
        summary["completion_tokens_per_s"] = ratio_summary(runs, "completion_tokens_per_s")
    summary["pairs_done"] = len(runs) // 2
    summary["run_seconds"] = run_seconds
    if stopped:
        summary["stopped_early"] = stopped
    if sizing:
        summary["sizing"] = sizing
    settings = {
        k: v
        for k, v in vars(args).items()
        if k not in ("worker", "worker_out", "output_dir", "verbose", "allocated_at_start")
    }
    settings["model"] = args.model or "build_tiny_model() defaults"
    lines = [
        f"# RiskPO vs GRPO overhead ({settings['model']}, {args.device}, {args.threads} thread(s))",
        "",
        (
            f"{len(runs)} runs in ABBA order{' in one process' if args.in_process else ''}, {args.steps} steps each, "
            f"median per-step time after {args.warmup} warm-up steps; {args.prompts_per_step} prompts x "
            f"{args.num_generations} completions per step, max_completion_length={args.max_completion_length}"
            f"{', gradient checkpointing' if args.gradient_checkpointing else ''}."
            + (f" {stopped[0].upper()}{stopped[1:]}." if stopped else "")
        ),
        "",
        "| measure | GRPO | RiskPO | ratio of medians | median of pair ratios | geometric mean, 95% interval |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [
        ("step time (ms)", "step_time_s", 1e3, ".1f"),
        ("optimisation phase (ms)", "optimisation_time_s", 1e3, ".1f"),
        ("step CPU time (ms)", "step_cpu_time_s", 1e3, ".1f"),
        ("peak RSS (MiB)", "peak_rss_mib", 1, ".0f"),
        ("peak CUDA allocated (MiB)", "peak_cuda_allocated_mib", 1, ".0f"),
        ("completion tokens / s", "completion_tokens_per_s", 1, ".0f"),
    ]
    for label, key, scale, digits in rows:
        if key in summary:
            row = summary[key]
            lines.append(
                f"| {label} | {scale * row['grpo']:{digits}} | {scale * row['riskpo']:{digits}} | "
                f"{row['ratio']:.3f} | {row['median_pair_ratio']:.3f} | {describe_interval(row['interval'])} |"
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
            f"Measured from the public seams (reward function's return to batch observer, RiskPO's median minus "
            f"GRPO's): RiskPO's own work per step (bundling, tracker, advantages, metrics and logging after GRPO's "
            f"generate-and-score) costs {1e3 * added['cpu_s']:.2f} ms CPU "
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


def size_from_pilot(runs: list[dict[str, Any]], most: int) -> dict[str, Any]:
    """The pairs the pilot pairs' spread needs for a ±2% interval (the larger of the whole step's and the optimisation
    phase's), at most ``most``: the second stage of a two-stage design."""
    spreads = {
        key: log_ratio_spread(ratio_summary(runs, key)["pair_ratios"])
        for key in ("median_step_s", "median_optimisation_s")
        if all(key in run for run in runs)
    }
    needed = pairs_needed(max(spreads.values()))
    wanted = max(len(runs) // 2, min(most, needed))
    return {
        "pilot_pairs": len(runs) // 2,
        "pilot_spreads": spreads,
        "pairs_needed": needed,
        "pairs_wanted": wanted,
        "note": f"the {len(runs) // 2} pilot pairs' spread needs {needed} pairs for ±2%; running {wanted}",
    }


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
    return (
        flags
        + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])
        + (["--fixed-length"] if args.fixed_length else [])
    )


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
    parser.add_argument(
        "--fixed-length",
        action="store_true",
        help="Generate exactly --max-completion-length tokens (min_new_tokens equal to it), so runs do equal work.",
    )
    parser.add_argument("--out", default=None, help="Results directory (default: benchmarks/results).")
    parser.add_argument("--verbose", action="store_true", help="Show the runs' training logs.")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="Run the trainers in this process, one after another (for CUDA; see above).",
    )
    parser.add_argument(
        "--size-after",
        type=int,
        default=None,
        help="After this many pilot pairs, run only as many pairs as their spread needs for a ±2%% interval "
        "(benchmarks.pair_design), at most --pairs.",
    )
    parser.add_argument(
        "--deadline", type=float, default=None, help="Seconds since the epoch; no pair starts that would end after it."
    )
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--allocated-at-start", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size_after is not None and not 2 <= args.size_after <= args.pairs:
        parser.error(f"--size-after ({args.size_after}) must be between 2 and --pairs ({args.pairs}).")
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
