"""The GPU check's DeepSpeed part: RiskPO and GRPO under ``accelerate launch`` with the recipes' ZeRO-2 and ZeRO-3
configs, against the same first step without DeepSpeed, and an exact resume under ZeRO-3.

Each DeepSpeed run is one ``accelerate launch`` of this module's worker (``--worker SETTINGS_JSON``) with the
recipe's config, only the process count (and, in a dry run, the CPU settings of ``zero3_cpu.yaml``) changed; the
runs without DeepSpeed run the same worker in the calling process. The optimizer is torch's AdamW, so DeepSpeed
compiles nothing (its wheel is built without ops: ``benchmarks/gpu_wheels.py``).

What is compared:

- the first optimizer step's loss, gradient norm and token entropy against the run without DeepSpeed, both started
  from the same random state, within ``BF16_TOLERANCE`` on a GPU (bf16) and ``FP32_TOLERANCE`` in a dry run. The
  step is on-policy, so its loss is minus the mean advantage: it shows the advantages reach the loss. The gradient
  norm and the entropy show the model's numerics agree;
- a ZeRO-3 RiskPO run saved at ``SAVE_AT`` and resumed from that checkpoint: every later step repeats exactly
  (tracker, bundles, completions, advantages), and the tracker is the one saved. Both runs use torch's deterministic
  algorithms, so the comparison tests the checkpoint, not the order of CUDA's atomic additions;
- peak memory per stage: ``torch.cuda.max_memory_allocated`` (peak RSS in a dry run), each run from a fresh start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "recipes" / "accelerate_configs"
STAGES = {"zero2": CONFIGS / "zero2.yaml", "zero3": CONFIGS / "zero3.yaml"}
# What a dry run changes in a recipe's config to run on the CPU: zero3_cpu.yaml's settings (gloo, fp32).
CPU_SETTINGS = {"use_cpu": True, "mixed_precision": "no"}
STEPS = {"gpu": 4, "dry_run": 2}
SAVE_AT = {"gpu": 2, "dry_run": 1}
# Relative tolerances of the first step's figures against the run without DeepSpeed (absolute below 1). bf16 keeps 8
# significant bits, so one rounding moves a value by up to 2**-8 of it; the loss and the entropy may differ by two
# such roundings, the gradient norm (a sum over every parameter's bf16 gradient) by 2**-5.
BF16_TOLERANCE = {"loss": 2**-7, "entropy": 2**-7, "grad_norm": 2**-5}
FP32_TOLERANCE = dict.fromkeys(BF16_TOLERANCE, 1e-4)
RUNS = (  # (label, stage or None, trainer, what the run is for)
    ("plain-grpo", None, "grpo", "first step"),
    ("plain-riskpo", None, "riskpo", "first step"),
    ("zero2-grpo", "zero2", "grpo", "first step"),
    ("zero2-riskpo", "zero2", "riskpo", "first step"),
    ("zero3-grpo", "zero3", "grpo", "first step"),
    ("zero3-riskpo", "zero3", "riskpo", "first step, saved for the resume"),
    ("zero3-riskpo-resumed", "zero3", "riskpo", "resumed"),
)


# --- the worker: one run, under accelerate launch or in the calling process ---------------------------------------


def run_worker(settings: dict[str, Any]) -> dict[str, Any]:
    """Train ``settings["steps"]`` steps with one trainer and return what the check compares."""
    import resource

    import torch
    import transformers

    from benchmarks.overhead import digit_reward, prompts
    from benchmarks.step_records import StepRecorder, first_step_metrics
    from riskpo_trl import job
    from riskpo_trl.trainer.observed import observed_trainer
    from riskpo_trl.trainer.registry import get_trainer_classes

    on_gpu = settings["device"] == "cuda"
    if settings["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    length = settings["max_completion_length"]
    config_class, trainer_class = get_trainer_classes(settings["trainer"])
    if not hasattr(trainer_class, "add_batch_observer"):  # TRL's own baseline: the step records observe its batches
        trainer_class = observed_trainer(trainer_class)
    args = config_class(
        output_dir=settings["output_dir"],
        max_steps=settings["steps"],
        learning_rate=1e-5 if on_gpu else 1e-3,
        seed=7,
        num_generations=4,
        per_device_train_batch_size=16,  # 4 prompts x 4 completions
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        max_completion_length=length,
        generation_kwargs={"min_new_tokens": length},
        beta=0.0,
        importance_sampling_level="sequence",
        loss_type="grpo",
        optim="adamw_torch",  # a plain torch optimizer: DeepSpeed has nothing to compile
        model_init_kwargs={"dtype": "bfloat16"} if on_gpu else None,
        bf16=on_gpu,
        use_cpu=not on_gpu,
        logging_steps=1,
        save_strategy="no",  # one checkpoint, at save_at (below): a ZeRO-3 checkpoint of 0.5B parameters is 7 GB
        report_to="none",
        disable_tqdm=True,
        gradient_checkpointing=False,
        **({"bundle_size": 2} if settings["trainer"] == "riskpo" else {}),
    )
    trainer = job.build(  # as riskpo-train builds it
        trainer_class,
        model=settings["model"],
        reward_funcs=digit_reward,
        args=args,
        train_dataset=prompts(4 * settings["steps"]),
    )
    recorder = StepRecorder(trainer)
    save_at = settings["save_at"]

    class SaveOnce(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == save_at:
                control.should_save = True

    trainer.add_callback(SaveOnce())
    if not settings["resume_from"]:
        # Every first-step run starts from the same random state, whatever DeepSpeed's set-up drew before.
        class Reseed(transformers.TrainerCallback):
            def on_train_begin(self, *a, **k):
                transformers.set_seed(args.seed)

        trainer.add_callback(Reseed())
    allocated_at_start = 0
    if on_gpu:
        allocated_at_start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    started = time.time()
    trainer.train(resume_from_checkpoint=settings["resume_from"])
    plugin = trainer.accelerator.state.deepspeed_plugin
    optimizer = trainer.optimizer
    while getattr(optimizer, "optimizer", None) is not None:  # accelerate's and DeepSpeed's wrappers around torch's
        optimizer = optimizer.optimizer
    result = {
        "label": settings["label"],
        "trainer": settings["trainer"],
        "train_seconds": round(time.time() - started, 1),
        "zero_stage": plugin.zero_stage if plugin is not None else None,
        "world_size": trainer.accelerator.num_processes,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
        "first_step": first_step_metrics(trainer.state.log_history),
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "steps": recorder.steps,
        "tracker_at_start": recorder.tracker_at_start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if on_gpu:
        result["peak_cuda_allocated_mib"] = (torch.cuda.max_memory_allocated() - allocated_at_start) / 2**20
    trainer.accelerator.end_training()  # gloo's threads can abort a rank left to interpreter exit
    return result


# --- the driver ---------------------------------------------------------------------------------------------------


def launch_config(stage: str, dry_run: bool, out: Path) -> tuple[Path, dict[str, Any]]:
    """The recipe's accelerate config with one process (and, in a dry run, the CPU settings); returns its path and
    what was changed."""
    import yaml

    config = yaml.safe_load(STAGES[stage].read_text())
    changes: dict[str, Any] = {"num_processes": 1}
    if dry_run:
        changes.update(CPU_SETTINGS)
        changes["deepspeed_config"] = {**config["deepspeed_config"], "zero3_init_flag": False}
    config.update(changes)
    path = out / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, changes


def launch(settings: dict[str, Any], config: Path, deadline: float, port: int) -> dict[str, Any]:
    """One ``accelerate launch`` of the worker; its result, or what it printed last when it failed."""
    out = Path(settings["output_dir"] + ".json")
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(port),
        "-m",
        "benchmarks.gpu_deepspeed",
        "--worker",
        json.dumps(settings),
        "--worker-out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", "1")
    if settings["deterministic"]:  # before the process makes its first cuBLAS handle
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        finished = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - time.time())
        )
    except subprocess.TimeoutExpired:
        return {"error": "stopped at the time budget's end"}
    if finished.returncode != 0 or not out.exists():
        tail = (finished.stdout + finished.stderr).strip().splitlines()[-15:]
        return {"error": f"accelerate launch exited with {finished.returncode}", "output_tail": tail}
    return json.loads(out.read_text())


def within(a: float, b: float, tolerance: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def compare_first_steps(plain: dict[str, Any], run: dict[str, Any], tolerance: dict[str, float]) -> dict[str, Any]:
    """The first step's figures of ``run`` against the run without DeepSpeed, and whether they agree."""
    same_completions = plain["steps"]["1"]["completion_ids"] == run["steps"]["1"]["completion_ids"]
    figures = {
        key: {"plain": plain["first_step"].get(key, math.nan), "deepspeed": run["first_step"].get(key, math.nan)}
        for key in tolerance
    }
    agree = {key: within(v["plain"], v["deepspeed"], tolerance[key]) for key, v in figures.items()}
    return {"figures": figures, "agree": agree, "same_completions": same_completions, "ok": all(agree.values())}


def check_deepspeed(device: str, dry_run: bool, workdir: Path, model: Path, deadline: float) -> dict[str, Any]:
    """The DeepSpeed part (see the module's docstring)."""
    from benchmarks.step_records import steps_differing

    kind = "dry_run" if dry_run else "gpu"
    steps, save_at = STEPS[kind], SAVE_AT[kind]
    tolerance = FP32_TOLERANCE if dry_run else BF16_TOLERANCE
    out = workdir / "deepspeed"
    out.mkdir(parents=True, exist_ok=True)
    configs = {stage: launch_config(stage, dry_run, out) for stage in STAGES}
    runs: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for index, (label, stage, trainer, purpose) in enumerate(RUNS):
        if time.time() > deadline:
            notes.append(f"{label}: skipped, the time budget ran out")
            continue
        resumed = purpose == "resumed"
        settings = {
            "label": label,
            "trainer": trainer,
            "device": device,
            "model": str(model),
            "steps": steps,
            "max_completion_length": 32 if not dry_run else 8,
            "save_at": save_at if purpose.endswith("resume") else 0,
            "resume_from": str(out / "zero3-riskpo" / f"checkpoint-{save_at}") if resumed else None,
            "deterministic": label.startswith("zero3-riskpo"),
            "output_dir": str(out / label),
        }
        print(f"[gpu_check] deepspeed: {label} ({purpose}) ...", flush=True)
        if stage is None:
            runs[label] = run_in_process(settings)
        else:
            runs[label] = launch(settings, configs[stage][0], deadline, port=29600 + index)
    result: dict[str, Any] = {
        "steps": steps,
        "saved_at": save_at,
        "tolerance": tolerance,
        "config_changes": {stage: changes for stage, (_, changes) in configs.items()},
        "notes": notes,
        "errors": {label: run for label, run in runs.items() if "error" in run},
    }
    ok = not result["errors"] and not notes
    comparisons = {}
    for label, run in runs.items():
        plain = runs.get(f"plain-{run.get('trainer')}")
        if run.get("zero_stage") and not run.get("label", "").endswith("resumed") and plain and "error" not in plain:
            comparisons[label] = compare_first_steps(plain, run, tolerance)
            ok &= comparisons[label]["ok"]
    result["first_step_against_plain"] = comparisons
    full, resumed = runs.get("zero3-riskpo", {}), runs.get("zero3-riskpo-resumed", {})
    if "steps" in full and "steps" in resumed:
        full_steps = {int(k): v for k, v in full["steps"].items()}
        resumed_steps = {int(k): v for k, v in resumed["steps"].items()}
        differing = steps_differing(full_steps, resumed_steps, range(save_at + 1, steps + 1))
        if resumed["tracker_at_start"] != full_steps[save_at]["tracker"]:
            differing.append(f"the tracker restored at the resume is not the one saved at step {save_at}")
        result["zero3_resume"] = {"steps_compared": list(range(save_at + 1, steps + 1)), "differing": differing}
        ok &= not differing
    else:
        ok = False
    memory_key = "peak_rss_mib" if dry_run else "peak_cuda_allocated_mib"
    result["peak_memory_mib"] = {label: run[memory_key] for label, run in runs.items() if memory_key in run}
    result["memory_measure"] = (
        "peak RSS of the process (MiB; a dry run's stand-in)" if dry_run else "torch.cuda.max_memory_allocated (MiB)"
    )
    result["optimizers"] = sorted({run["optimizer"] for run in runs.values() if "optimizer" in run})
    result["zero_stages"] = {label: run.get("zero_stage") for label, run in runs.items() if "error" not in run}
    result["ok"] = bool(ok and all(name.startswith("torch.") for name in result["optimizers"]))
    return result


def run_in_process(settings: dict[str, Any]) -> dict[str, Any]:
    """A run without DeepSpeed in this process, its steps' keys written as the launched runs' JSON writes them."""
    import gc

    import torch

    result = json.loads(json.dumps(run_worker(settings)))
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", required=True, help="the run's settings, as JSON")
    parser.add_argument("--worker-out", required=True, type=Path, help="where the run's result goes")
    args = parser.parse_args(argv)
    result = run_worker(json.loads(args.worker))
    if int(os.environ.get("RANK", "0")) == 0:
        args.worker_out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
