"""The GPU check: one command that checks this package on a CUDA GPU and measures RiskPO against GRPO there.

    python -m benchmarks.gpu_wheels install --wheels .whl     # first, on the GPU machine (it has no network)
    python -m benchmarks.gpu_check --out "$OUT"               # at most 9 minutes (--budget-s 540)
    python -m benchmarks.gpu_check --dry-run                  # the same code on CPU with tiny models
    python -m benchmarks.gpu_check --parts deepspeed performance   # a rerun: only these parts

Parts, in this order, each run only if the time budget (``--budget-s``) still holds its minimum and leaves the later
parts theirs, else skipped with a note. The files are written again after every part, so a call cut short still
returns what was done.

1. Environment: versions of torch, CUDA, transformers, accelerate, peft, TRL, datasets and math-verify, the GPU and
   its driver, and what the package's pins make of them. Releases outside the tested range are run anyway with
   RISKPO_ALLOW_UNTESTED_VERSIONS=1, and the output says so.
2. Risk math: every combination of the names in the risk registries that ``RiskEstimator`` takes (bundling, risk
   profile, advantage scaling, quantile source, credit rule, and any registry added later) and of its on/off switches,
   stepped on the same reward batches on the GPU and on the CPU: bundles, tracker, advantages and metrics must agree.
3. Training: the tiny model trained 4 steps in bf16 on the GPU, and again from its step-2 checkpoint: steps 3 and 4
   must repeat exactly (tracker, bundles, completions, advantages), the tracker restored; the weights' largest
   difference is reported.
4. Loss: TRL's sequence-level loss and its gradients on the GPU against the direct implementation of the paper's
   objective in tests/test_loss.py (in fp32, with that test's tolerances).
5. LoRA: the training check with a LoRA adapter (PEFT) in bf16: only the adapter trains, the checkpoint holds it, and
   the resumed steps repeat exactly.
6. DeepSpeed (``benchmarks.gpu_deepspeed``): RiskPO and GRPO on Qwen2.5-0.5B's sizes with random weights, under
   ``accelerate launch`` with the recipes' ZeRO-2 and ZeRO-3 configs in bf16 on one GPU: the first step against the
   same step without DeepSpeed, an exact resume under ZeRO-3, peak memory per stage.
7. Performance: ``benchmarks.overhead`` on a random-weight model with Qwen2.5-0.5B's sizes, transformers generation,
   bf16, the paper's batch shape scaled down, every completion exactly 64 tokens, one seed: GRPO/RiskPO pairs in
   ABBA order, the whole step and its optimisation phase timed; 4 pilot pairs, then as many as their spread needs
   for a ±2% interval of the ratio (``benchmarks.pair_design``) while the budget holds them.

It writes gpu_check.json and gpu_check.md (a table ready for docs/benchmarks.md) under ``--out`` (default
benchmarks/results/gpu) and prints a one-line summary last. A dry run writes gpu_check_dry_run.{json,md}, to a
temporary directory unless ``--out`` is given: its figures are CPU figures of tiny models, never GPU results.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.pair_design import describe_interval, log_ratio_spread, pairs_needed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results" / "gpu"
PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "peft",
    "trl",
    "datasets",
    "math-verify",
    "huggingface-hub",
    "tokenizers",
    "safetensors",
    "numpy",
    "pyarrow",
    "riskpo-trl",
)

# The sizes of Qwen2.5-0.5B and Qwen2.5-1.5B, from their config.json on the Hugging Face Hub (Qwen/Qwen2.5-0.5B,
# Qwen/Qwen2.5-1.5B; the -Instruct models have the same sizes), which the GPU machine cannot reach; several public
# repositories quote the same numbers. max_position_embeddings changes no computation here.
QWEN25_SIZES = {
    "Qwen2.5-0.5B": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-1.5B": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
# The dry run's stand-in: the same builder, a few thousand parameters and a padded vocabulary.
DRY_RUN_SIZES = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=512,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
# The paper trains on 512 prompts x 10 completions per batch, bundles of 5, up to 3072 tokens (section 5). Scaled to
# a few seconds a step: 10 prompts (two bundle groups) x 10 completions of exactly 64 tokens (min_new_tokens equal to
# max_new_tokens), the same seed in every run, so every run does the same work.
PERF_FLAGS = [
    "--num-generations",
    "10",
    "--prompts-per-step",
    "10",
    "--bundle-size",
    "5",
    "--steps",
    "3",
    "--warmup",
    "1",
    "--threads",
    "4",
    "--seed",
    "0",
    "--in-process",
    "--fixed-length",
]
PERF_LENGTH = {"gpu": 64, "dry_run": 8}
PERF_MODELS = ("Qwen2.5-0.5B",)  # the 1.5B's figures of 2026-11-27 stand; --perf-models adds it back
# The pairs are sized on the device, in two stages: PERF_PILOT_PAIRS pairs, then as many as their spread needs for a
# ±2% interval (benchmarks.pair_design.pairs_needed), at most PERF_PAIRS and while the budget holds them. The CPU dry
# run's spread cannot size them: on 2 shared cores at load 5.7-12.6 it was 0.38 (step) and 0.29 (optimisation phase),
# which asks 1,430 pairs; it measures the machine's load, not the GPU. The dry run runs the same two stages, smaller.
PERF_PILOT_PAIRS = {"gpu": 4, "dry_run": 2}
PERF_PAIRS = {"gpu": 60, "dry_run": 3}
# The whole check's default time: on a GPU it leaves, of 12 minutes, about 1.5 for the machine's start and the wheels'
# install (45 s and 10 s on 2026-11-27, DeepSpeed's wheel not yet among them) and a margin.
BUDGET_S = {"gpu": 540.0, "dry_run": 1200.0}
# Seconds a part needs at least; a part starts only with that much of the budget left, and a part that runs until
# a deadline stops early enough to leave the later parts theirs.
PART_MINIMUM_S = {
    "risk_math": 20,
    "training": 45,
    "loss": 15,
    "lora": 30,
    "deepspeed": 200,
    "performance": 100,
}


# --- 1. environment ------------------------------------------------------------------------------------------------


def environment_report(device: str) -> dict[str, Any]:
    """Versions, the GPU and its driver, and the pins' verdict; sets RISKPO_ALLOW_UNTESTED_VERSIONS=1 when needed."""
    import torch

    from riskpo_trl import compat

    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: compat.installed_version(name) for name in PACKAGES},
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu_count": os.cpu_count(),
    }
    if hasattr(os, "getloadavg"):
        report["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        report["gpu"] = {
            "name": properties.name,
            "capability": f"{properties.major}.{properties.minor}",
            "memory_gib": round(properties.total_memory / 2**30, 1),
            "multiprocessors": properties.multi_processor_count,
            "driver": gpu_driver(),
            "bf16": torch.cuda.is_bf16_supported(),
        }
    report["pins"] = pin_verdicts()
    problems = compat.version_problems()
    report["tested_range"] = {
        package: tested_position(compat.installed_version(package), *ends) for package, ends in compat.TESTED.items()
    }
    if problems:
        os.environ[compat.ALLOW_UNTESTED_ENV] = "1"
        report["untested_versions_allowed"] = (
            f"{compat.ALLOW_UNTESTED_ENV}=1 was set for this check, because: " + "; ".join(problems)
        )
    return report


def gpu_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML binding: ask nvidia-smi
        try:
            return (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.strip()
                or None
            )
        except (OSError, subprocess.SubprocessError):
            return None


def package_requirements() -> list[str]:
    """This package's requirements: from the installed distribution, else from pyproject.toml."""
    try:
        requires = importlib.metadata.requires("riskpo-trl")
    except importlib.metadata.PackageNotFoundError:
        requires = None
    if requires is None:
        import tomllib

        requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [line for line in requires if "extra ==" not in line]


def pin_verdicts() -> dict[str, dict[str, Any]]:
    """For each requirement of the package: the pin, the installed release and whether the pin accepts it."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from riskpo_trl.compat import installed_version

    verdicts = {}
    for line in package_requirements():
        requirement = Requirement(line)
        installed = installed_version(requirement.name)
        verdicts[requirement.name] = {
            "pin": str(requirement.specifier),
            "installed": installed,
            "accepted": installed is not None and requirement.specifier.contains(Version(installed), prereleases=True),
        }
    return verdicts


def tested_position(installed: str | None, lowest: str, newest: str) -> str:
    """Where ``installed`` lies against the two tested releases (CI runs the package at both ends only)."""
    from packaging.version import Version

    if installed is None:
        return "not installed"
    if installed in (lowest, newest):
        return f"{installed}: a tested release"
    if Version(lowest) < Version(installed) < Version(newest):
        return f"{installed}: between the tested releases {lowest} and {newest}, not itself run by CI"
    return f"{installed}: outside the tested releases {lowest} to {newest}"


# --- 2. risk math on the device against the CPU -------------------------------------------------------------------


def estimator_grid() -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    """Every combination of RiskEstimator's registry-named choices and on/off switches (the registries are found in
    riskpo_trl.risk, so a registry added there is covered without a change here)."""
    from riskpo_trl import risk
    from riskpo_trl.registry import Registry

    parameters = inspect.signature(risk.RiskEstimator.__init__).parameters
    choices: dict[str, list[Any]] = {
        registry.field: list(registry)
        for registry in vars(risk).values()
        if isinstance(registry, Registry) and registry.field in parameters
    }
    choices.update({name: [True, False] for name, p in parameters.items() if isinstance(p.default, bool)})
    return choices, [dict(zip(choices, values)) for values in itertools.product(*choices.values())]


def reward_batches(num_generations: int) -> list[tuple[str, Any, bool]]:
    """(name, rewards, train): binary with unscorable completions, continuous, all equal, and a partial eval batch."""
    import torch

    generator = torch.Generator().manual_seed(0)
    binary = (torch.rand(10 * num_generations, generator=generator) < 0.4).float()
    binary[[3, 17, 40]] = float("nan")
    continuous = torch.rand(10 * num_generations, generator=generator, dtype=torch.float32)
    return [
        ("binary_with_unscorable", binary, True),
        ("continuous", continuous, True),
        ("all_equal", torch.ones(10 * num_generations), True),
        ("eval_partial_group", (torch.rand(7 * num_generations, generator=generator) < 0.5).float(), False),
    ]


def largest_difference(a: Any, b: Any) -> float:
    """The largest difference of two values (tensors, floats or dicts of floats), relative to the value where that
    exceeds 1 (float32 results agree to ~1e-7 of their size); NaN matching NaN is 0, NaN against a number infinite."""
    import torch

    if isinstance(a, dict):
        if set(a) != set(b):
            return math.inf
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    a = torch.as_tensor(a, dtype=torch.float64).cpu()
    b = torch.as_tensor(b, dtype=torch.float64).cpu()
    if a.shape != b.shape:
        return math.inf
    same_nan = torch.isnan(a) & torch.isnan(b)
    if (torch.isnan(a) ^ torch.isnan(b)).any():
        return math.inf
    diff = ((a - b).abs() / a.abs().clamp(min=1))[~same_nan]
    return diff.max().item() if diff.numel() else 0.0


def check_risk_math(device: str, tolerance: float = 1e-6) -> dict[str, Any]:
    """RiskEstimator on ``device`` against the CPU, for every combination, on the same rewards and permutations."""
    import torch

    from riskpo_trl.risk import RiskEstimator

    num_generations, bundle_size = 8, 5
    choices, grid = estimator_grid()
    batches = reward_batches(num_generations)
    worst = {"advantages": 0.0, "bundle_scores": 0.0, "tracker": 0.0, "metrics": 0.0}
    mismatches, invalid, checked, bitwise = [], 0, 0, 0
    for combination in grid:
        estimators = []
        try:
            for _ in range(2):
                estimators.append(
                    RiskEstimator(
                        num_generations=num_generations,
                        bundle_size=bundle_size,
                        alpha=0.2,
                        beta=0.8,
                        omega=0.5,
                        **combination,
                    )
                )
        except ValueError:
            invalid += 1  # e.g. the authors' scaling of a profile that has none
            continue
        on_cpu, on_device = estimators
        for index, (name, rewards, train) in enumerate(batches):
            results = []
            for estimator, where in ((on_cpu, "cpu"), (on_device, device)):
                batch = estimator.step(
                    rewards.to(where), generator=torch.Generator().manual_seed(100 + index), train=train
                )
                results.append(
                    {
                        "advantages": batch.advantages,
                        "bundle_ids": batch.bundle_ids,
                        "bundle_scores": batch.bundle_scores,
                        "metrics": estimator.metrics(batch),
                        "tracker": estimator.tracker.values if estimator.tracker.initialized else torch.zeros(2),
                        "on_device": batch.advantages.device.type,
                    }
                )
            reference, candidate = results
            if candidate["on_device"] != torch.device(device).type:
                mismatches.append(f"{combination} {name}: advantages came back on {candidate['on_device']}")
            checked += 1
            if not torch.equal(reference["bundle_ids"].cpu(), candidate["bundle_ids"].cpu()):
                mismatches.append(f"{combination} {name}: bundle ids differ")
                continue
            differences = {key: largest_difference(reference[key], candidate[key]) for key in worst}
            bitwise += all(d == 0 for d in differences.values())
            for key, difference in differences.items():
                worst[key] = max(worst[key], difference)
                if difference > tolerance:
                    mismatches.append(f"{combination} {name}: {key} differ by {difference:.3g}")
    return {
        "ok": not mismatches and checked > 0,
        "device": device,
        "choices": choices,
        "combinations": len(grid) - invalid,
        "invalid_combinations_skipped": invalid,
        "batches_compared": checked,
        "batches_bitwise_equal": bitwise,
        "largest_difference": worst,
        "tolerance": tolerance,
        "mismatches": mismatches[:20],
    }


# --- 3. training in bf16 and its resume ----------------------------------------------------------------------------


def check_training_resume(device: str, workdir: Path, lora: bool = False) -> dict[str, Any]:
    """Train the tiny model 4 steps in bf16 on ``device`` (with ``lora``: a LoRA adapter, PEFT), then again from the
    step-2 checkpoint; steps 3 and 4 must repeat exactly, and the tracker must be restored."""
    import torch

    from benchmarks.overhead import digit_reward, prompts
    from benchmarks.step_records import StepRecorder, steps_differing
    from riskpo_trl import RiskPOConfig, RiskPOTrainer
    from riskpo_trl.tiny_model import build_tiny_model

    model_dir = workdir / "tiny-model"
    if not model_dir.exists():
        build_tiny_model(model_dir)
    name = "lora" if lora else "bf16"
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")

    def train(output_dir: Path, resume_from: Path | None = None, **overrides) -> RiskPOTrainer:
        settings = dict(
            output_dir=str(output_dir),
            max_steps=4,
            max_completion_length=16,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            learning_rate=1e-3,
            gradient_checkpointing=False,
            seed=7,
            bf16=True,
            use_cpu=device == "cpu",
            disable_tqdm=True,
            steps_per_generation=5,
        )
        settings.update(overrides)
        trainer = RiskPOTrainer(
            str(model_dir),
            reward_funcs=digit_reward,
            args=RiskPOConfig(**settings),
            train_dataset=prompts(20),
            peft_config=peft_config,
        )
        trainer.recorder = StepRecorder(trainer)
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return trainer

    full = train(workdir / f"{name}-full", save_strategy="steps", save_steps=2)
    checkpoint = workdir / f"{name}-full" / "checkpoint-2"
    resumed = train(workdir / f"{name}-resumed", resume_from=checkpoint)
    differing = steps_differing(full.recorder.steps, resumed.recorder.steps, (3, 4))
    if resumed.recorder.tracker_at_start != full.recorder.steps[2]["tracker"]:
        differing.append("the tracker restored at the resume is not the one saved at step 2")
    weights = max(
        (a.float() - b.float()).abs().max().item()
        for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values())
    )
    losses = [e["loss"] for e in full.state.log_history if "loss" in e]
    result = {
        "ok": not differing and all(math.isfinite(loss) for loss in losses),
        "device": str(full.model.device),
        "mixed_precision": str(full.accelerator.mixed_precision),
        "model_dtype": str(full.model.dtype),
        "losses": losses,
        "resumed_steps_differing": differing,
        "largest_weight_difference_after_step_4": weights,
    }
    if lora:
        trainable = [n for n, p in full.model.named_parameters() if p.requires_grad]
        adapter_saved = (checkpoint / "adapter_model.safetensors").exists()
        only_lora = bool(trainable) and all("lora_" in n for n in trainable)
        result.update(
            ok=result["ok"] and adapter_saved and only_lora,
            trainable_parameters=sum(p.numel() for p in full.model.parameters() if p.requires_grad),
            only_lora_parameters_trainable=only_lora,
            adapter_saved_in_checkpoint=adapter_saved,
            adapter_dtype=str(next(p.dtype for n, p in full.model.named_parameters() if "lora_" in n)),
        )
    if device == "cuda":
        del full, resumed
        torch.cuda.empty_cache()
    return result


def check_lora_resume(device: str, workdir: Path) -> dict[str, Any]:
    """The training check with a LoRA adapter (PEFT) in bf16: the adapter alone trains, is saved, and resumes exactly."""
    return check_training_resume(device, workdir, lora=True)


# --- 4. the loss against the direct implementation -----------------------------------------------------------------


def check_loss(device: str, workdir: Path) -> dict[str, Any]:
    """tests/test_loss.py's comparison (TRL's loss and gradients against the paper's objective) on ``device``."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_loss import loss_against_paper
    finally:
        sys.path.remove(str(ROOT / "tests"))
    from benchmarks.overhead import digit_reward, prompts
    from riskpo_trl import RiskPOConfig, RiskPOTrainer

    model_dir = workdir / "tiny-model"  # built by the training check, or here when that one was skipped
    if not model_dir.exists():
        from riskpo_trl.tiny_model import build_tiny_model

        build_tiny_model(model_dir)
    args = RiskPOConfig(
        output_dir=str(workdir / "loss"),
        report_to="none",
        gradient_checkpointing=False,
        max_completion_length=8,
        bf16=False,
        use_cpu=device == "cpu",
    )
    trainer = RiskPOTrainer(str(model_dir), reward_funcs=digit_reward, args=args, train_dataset=prompts(20))
    result = loss_against_paper(trainer)
    return {
        "ok": bool(result["loss_matches"] and result["grads_match"] and result["clipped"] > 0),
        "device": str(trainer.model.device),
        "dtype": str(trainer.model.dtype),
        **result,
    }


# --- 5. performance ------------------------------------------------------------------------------------------------


def build_random_model(path: Path, sizes: dict[str, Any], device: str) -> Path:
    """A random-weight Qwen2 model of ``sizes`` (bf16 on a GPU) with a character tokenizer padded to its vocabulary,
    saved to ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from riskpo_trl.tiny_model import build_char_tokenizer

    tokenizer = build_char_tokenizer(vocab_size=sizes["vocab_size"])
    config = Qwen2Config(
        **sizes,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    if device == "cuda":
        model = model.to(torch.bfloat16)  # as the released checkpoints are stored, and as TRL then loads them
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return path


def run_performance(
    device: str,
    dry_run: bool,
    workdir: Path,
    deadline: float,
    checkpointing_settings: tuple[bool, ...] = (False,),
    models: tuple[str, ...] = PERF_MODELS,
    pairs: int | None = None,
) -> dict[str, Any]:
    """benchmarks.overhead for each model and checkpointing setting: ABBA pairs of runs that generate completions of
    one fixed length from one seed, timed as whole steps and as their optimisation phase. The pilot pairs' spread
    sizes the rest (at most ``pairs``, the default's maximum unless given)."""
    import torch

    from benchmarks import overhead

    sizes = DRY_RUN_SIZES if dry_run else {name: QWEN25_SIZES[name] for name in models}
    kind = "dry_run" if dry_run else "gpu"
    length, pilot = PERF_LENGTH[kind], PERF_PILOT_PAIRS[kind]
    pairs = pairs or PERF_PAIRS[kind]
    results, notes, slowest_run = {}, [], 0.0
    for checkpointing, name in itertools.product(checkpointing_settings, sizes):
        label = f"{name}, gradient checkpointing {'on' if checkpointing else 'off'}"
        # Start a setting only with room for one pair at the slowest run seen, plus a margin for a bigger model.
        if slowest_run and time.time() + 3 * slowest_run > deadline:
            notes.append(f"{label}: skipped, the time budget would not hold one pair")
            continue
        path = workdir / "models" / name
        if not path.exists():
            build_random_model(path, sizes[name], device)
        flags = [
            *PERF_FLAGS,
            "--pairs",
            str(pairs),
            "--size-after",
            str(min(pilot, pairs)),
            "--device",
            device,
            "--model",
            str(path),
            "--max-completion-length",
            str(length),
            "--deadline",
            str(deadline),
            "--out",
            str(workdir / "overhead" / label.replace(" ", "_")),
        ]
        payload = overhead.run_comparison(
            overhead.parse_args(flags + (["--gradient-checkpointing"] if checkpointing else []))
        )
        summary = payload["summary"]
        slowest_run = max(slowest_run, *summary["run_seconds"])
        results[label] = {
            "model": name,
            "gradient_checkpointing": checkpointing,
            "sizes": sizes[name],
            "settings": payload["settings"],
            "summary": summary,
            "runs": payload["runs"],
            "resolution": resolution(summary),
        }
        wanted = summary.get("sizing", {}).get("pairs_wanted", pairs)
        if summary["pairs_done"] < wanted:
            notes.append(f"{label}: only {summary['pairs_done']} of {wanted} pair(s) fitted the time budget")
        if device == "cuda":
            torch.cuda.empty_cache()
    return {
        "ok": bool(results),
        "results": results,
        "notes": notes,
        "pairs_planned": f"{min(pilot, pairs)} pilot pairs, then as many as their spread needs for ±2%, at most {pairs}",
        "batch_shape": "10 prompts x 10 completions per step, bundles of 5, completions of exactly "
        f"{length} tokens (the paper: 512 x 10, bundles of 5, up to 3072 tokens)",
    }


def resolution(summary: dict[str, Any]) -> dict[str, Any]:
    """Per timed measure: its ratio's 95% interval, whether it resolves ±2%, and how many pairs the spread seen here
    would need (the sizing rule of benchmarks.pair_design, for the next run)."""
    measures = {}
    for key in ("step_time_s", "optimisation_time_s"):
        if key not in summary or len(summary[key]["pair_ratios"]) < 2:
            continue
        spread = log_ratio_spread(summary[key]["pair_ratios"])
        measures[key] = {**summary[key]["interval"], "spread": spread, "pairs_needed": pairs_needed(spread)}
    return measures


def check_deepspeed(device: str, dry_run: bool, workdir: Path, deadline: float) -> dict[str, Any]:
    """The DeepSpeed part (benchmarks.gpu_deepspeed) on the performance part's first model: Qwen2.5-0.5B's sizes with
    random weights on a GPU, the tiny stand-in in a dry run."""
    from benchmarks import gpu_deepspeed

    name, sizes = next(iter(DRY_RUN_SIZES.items())) if dry_run else (PERF_MODELS[0], QWEN25_SIZES[PERF_MODELS[0]])
    path = workdir / "models" / name
    if not path.exists():
        build_random_model(path, sizes, device)
    return {"model": name, **gpu_deepspeed.check_deepspeed(device, dry_run, workdir, path, deadline)}


# --- output --------------------------------------------------------------------------------------------------------


def markdown_report(report: dict[str, Any]) -> str:
    env = report["environment"]
    versions = env.get("versions", {})
    gpu = env.get("gpu", {})
    title = "GPU check (DRY RUN on CPU: tiny models, no GPU figures)" if report["dry_run"] else "GPU check"
    lines = [
        f"# {title}",
        "",
        (
            f"Device: {gpu.get('name', 'CPU')}"
            + (
                f", driver {gpu.get('driver')}, {gpu.get('memory_gib')} GiB, "
                f"compute capability {gpu.get('capability')}"
                if gpu
                else ""
            )
            + f"; {env.get('cpu_count')} CPU cores, load "
            f"average at start {env.get('load_average_at_start')}."
        ),
        (
            f"Python {env.get('python')}, torch {versions.get('torch')} (CUDA {env.get('torch_cuda')}), transformers "
            f"{versions.get('transformers')}, accelerate {versions.get('accelerate')}, peft {versions.get('peft')}, TRL "
            f"{versions.get('trl')}, datasets {versions.get('datasets')}, math-verify {versions.get('math-verify')}."
        ),
        "",
    ]
    pins = env.get("pins", {})
    refused = [f"{name} {v['installed']} (pin {v['pin']})" for name, v in pins.items() if not v["accepted"]]
    lines.append(
        "Pins: "
        + ("every requirement accepted" if not refused else "not accepted: " + ", ".join(refused))
        + "; "
        + "; ".join(env.get("tested_range", {}).values())
        + "."
    )
    if env.get("untested_versions_allowed"):
        lines.append(f"**{env['untested_versions_allowed']}**")
    lines += ["", "| check | result | details |", "|---|---|---|"]
    for part, describe in (
        ("risk_math", describe_risk_math),
        ("training", describe_training),
        ("loss", describe_loss),
        ("lora", describe_lora),
        ("deepspeed", describe_deepspeed),
    ):
        result = report["parts"].get(part, {})
        details = describe(result) if "ok" in result else ""
        lines.append(f"| {part.replace('_', ' ')} | {verdict(result)} | {details} |")
    deepspeed = report["parts"].get("deepspeed", {})
    if deepspeed.get("first_step_against_plain") or deepspeed.get("peak_memory_mib"):
        lines += ["", *deepspeed_table(deepspeed)]
    performance = report["parts"].get("performance", {})
    if performance.get("results"):
        lines += [
            "",
            f"RiskPO against GRPO, same settings ({performance['batch_shape']}; one seed; sequence-level ratio, "
            "loss_type grpo, beta 0, one update per generation batch, transformers generation, bf16 where the GPU "
            "has it). Ratios are RiskPO / GRPO: the geometric mean of the ABBA pairs' ratios with its 95% interval "
            f"(t on the log ratios); pairs: {performance['pairs_planned']}. The "
            "optimisation phase runs from the batch observer (generation and scoring done) to the step's end.",
            "",
            "| model | grad. ckpt | pairs | GRPO step (ms) | RiskPO step (ms) | step-time ratio (95% interval) | "
            "optimisation-phase ratio (95% interval) | within ±2% (step; optimisation) | pairs the spread needs "
            "(step; optimisation) | peak memory GRPO / RiskPO (MiB) | memory ratio | RiskPO's own work (ms/step) | "
            "tokens/s GRPO / RiskPO |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for result in performance["results"].values():
            s = result["summary"]
            memory = s.get("peak_cuda_allocated_mib")
            tokens = s.get("completion_tokens_per_s")
            measures = result.get("resolution", {})
            step, optimisation = measures.get("step_time_s", {}), measures.get("optimisation_time_s", {})
            lines.append(
                f"| {result['model']} | {'on' if result['gradient_checkpointing'] else 'off'} | {s['pairs_done']} | "
                f"{1e3 * s['step_time_s']['grpo']:.0f} | {1e3 * s['step_time_s']['riskpo']:.0f} | "
                f"{describe_interval(step)} | {describe_interval(optimisation)} | "
                f"{yes_no(step.get('resolved'))}; {yes_no(optimisation.get('resolved'))} | "
                f"{step.get('pairs_needed', 'n/a')}; {optimisation.get('pairs_needed', 'n/a')} | "
                + (
                    f"{memory['grpo']:.0f} / {memory['riskpo']:.0f} | {memory['median_pair_ratio']:.3f} | "
                    if memory
                    else "n/a (CPU) | n/a | "
                )
                + f"{1e3 * s['riskpo_added_per_step']['wall_s']:.1f} | "
                + (f"{tokens['grpo']:.0f} / {tokens['riskpo']:.0f} |" if tokens else "n/a |")
            )
    notes = report["notes"] + performance.get("notes", [])
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    return "\n".join(lines)


def verdict(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    if "error" in result:
        return f"ERROR: {result['error']}"
    return "pass" if result.get("ok") else "FAIL"


def describe_risk_math(r: dict[str, Any]) -> str:
    worst = r["largest_difference"]
    return (
        f"{r['combinations']} combinations x 4 batches on {r['device']} against the CPU, "
        f"{r['batches_bitwise_equal']} of {r['batches_compared']} bitwise equal; largest difference "
        + ", ".join(f"{k} {v:.2g}" for k, v in worst.items())
        + (f"; {len(r['mismatches'])} mismatch(es)" if r["mismatches"] else "")
    )


def describe_training(r: dict[str, Any]) -> str:
    differing = r["resumed_steps_differing"]
    return (
        f"tiny model on {r['device']}, {r['mixed_precision']} mixed precision ({r['model_dtype']} weights); "
        f"resumed steps 3-4 {'differ: ' + ', '.join(differing) if differing else 'identical'}; largest weight "
        f"difference after step 4: {r['largest_weight_difference_after_step_4']:.2g}"
    )


def yes_no(flag: bool | None) -> str:
    return "n/a" if flag is None else ("yes" if flag else "no")


def describe_lora(r: dict[str, Any]) -> str:
    return (
        describe_training(r)
        + f"; {r['trainable_parameters']} trainable parameters, LoRA only: {yes_no(r['only_lora_parameters_trainable'])}"
        f", adapter in {r['adapter_dtype']}, saved in the checkpoint: {yes_no(r['adapter_saved_in_checkpoint'])}"
    )


def describe_deepspeed(r: dict[str, Any]) -> str:
    first = r.get("first_step_against_plain", {})
    agreeing = [label for label, c in first.items() if c["ok"]]
    resume = r.get("zero3_resume")
    return (
        f"{r.get('model')}, {r['steps']} steps per run; first step within tolerance of the run without DeepSpeed: "
        f"{len(agreeing)} of {len(first)} runs; ZeRO-3 resume from step {r['saved_at']}: "
        + (
            "not compared"
            if resume is None
            else ("steps repeat exactly" if not resume["differing"] else "differs: " + ", ".join(resume["differing"]))
        )
        + f"; optimizers {', '.join(r['optimizers'])}"
        + (f"; errors in {', '.join(r['errors'])}" if r["errors"] else "")
        + (f"; {'; '.join(r['notes'])}" if r["notes"] else "")
    )


def deepspeed_table(r: dict[str, Any]) -> list[str]:
    """The first step of each DeepSpeed run against the run without it, and every run's peak memory."""
    lines = [
        f"DeepSpeed, one process per run ({r.get('model')}; tolerance {r['tolerance']}, relative, absolute below 1; "
        f"memory: {r['memory_measure']}).",
        "",
        "| run | ZeRO stage | first-step loss (plain / DeepSpeed) | entropy | grad norm | same completions | agree | "
        "peak memory (MiB) |",
        "|---|---:|---:|---:|---:|---|---|---:|",
    ]
    first = r.get("first_step_against_plain", {})
    for label, memory in r.get("peak_memory_mib", {}).items():
        compared = first.get(label)
        figures = (
            [f"{v['plain']:.6g} / {v['deepspeed']:.6g}" for v in compared["figures"].values()]
            if compared
            else ["", "", ""]
        )
        lines.append(
            f"| {label} | {r['zero_stages'].get(label) or '-'} | {' | '.join(figures)} | "
            f"{yes_no(compared['same_completions']) if compared else ''} | "
            f"{yes_no(compared['ok']) if compared else ''} | {memory:.0f} |"
        )
    return lines


def describe_loss(r: dict[str, Any]) -> str:
    return (
        f"on {r['device']} in {r['dtype']}: loss {r['trl_loss']:.6f} vs {r['paper_loss']:.6f}, largest gradient "
        f"difference {r['max_grad_difference']:.2g}, clipped share {r['clipped']:.2f}"
    )


def summary_line(report: dict[str, Any], written: Path) -> str:
    parts = [f"{name} {verdict(result).split(':')[0]}" for name, result in report["parts"].items()]
    figures = []
    for result in report["parts"].get("performance", {}).get("results", {}).values():
        s = result["summary"]
        memory = s.get("peak_cuda_allocated_mib")
        measures = result.get("resolution", {})
        figures.append(
            f"{result['model']}{' ckpt' if result['gradient_checkpointing'] else ''} step x"
            f"{describe_interval(measures.get('step_time_s', {}))} optimisation x"
            f"{describe_interval(measures.get('optimisation_time_s', {}))}"
            + (f" mem x{memory['median_pair_ratio']:.3f}" if memory else "")
        )
    device = report["environment"].get("gpu", {}).get("name", "CPU")
    prefix = "gpu_check DRY RUN" if report["dry_run"] else "gpu_check"
    return (
        f"{prefix}: {device}; "
        + ", ".join(parts)
        + ("; " + ", ".join(figures) if figures else "")
        + f"; {report['total_s']:.0f} s; wrote {written}"
    )


# --- the command ---------------------------------------------------------------------------------------------------


def run_part(report: dict[str, Any], name: str, deadline: float, fn: Callable[..., dict[str, Any]], *args) -> None:
    """Run one part if the budget holds its minimum; a failure is recorded, and the next part still runs."""
    started = time.time()
    if deadline - started < PART_MINIMUM_S[name]:
        report["parts"][name] = {
            "skipped": f"{deadline - started:.0f} s of the budget left, it needs {PART_MINIMUM_S[name]} s"
        }
        return
    print(f"[gpu_check] {name} ...", flush=True)
    try:
        result = fn(*args)
    except Exception as error:  # a GPU-only bug is a finding: record it, go on with the other parts
        result = {
            "error": f"{type(error).__name__}: {error}".splitlines()[0][:300],
            "traceback": traceback.format_exc().splitlines()[-12:],
        }
    result["seconds"] = round(time.time() - started, 1)
    report["parts"][name] = result
    print(f"[gpu_check] {name}: {verdict(result)} ({result['seconds']} s)", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="Run on CPU with tiny models (no GPU needed).")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="Seconds for the whole check; parts that would not fit are skipped with a note "
        f"(default {BUDGET_S['gpu']:.0f} on a GPU, {BUDGET_S['dry_run']:.0f} in a dry run).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Where to write the JSON and markdown (default benchmarks/results/gpu; a dry run: a "
        "temporary directory).",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=list(PART_MINIMUM_S),
        default=list(PART_MINIMUM_S),
        help="The parts to run, in the usual order (default: all). A rerun after a fix can leave out what passed.",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        choices=("off", "on", "both"),
        default="off",
        help="The performance part's settings: without gradient checkpointing, with it, or both, while time is left "
        "(default: off).",
    )
    parser.add_argument(
        "--perf-models",
        nargs="+",
        choices=list(QWEN25_SIZES),
        default=list(PERF_MODELS),
        help=f"The performance part's model sizes (default: {', '.join(PERF_MODELS)}; a dry run: the tiny model).",
    )
    parser.add_argument(
        "--perf-pairs",
        type=int,
        default=None,
        help=f"The most GRPO/RiskPO pairs per performance setting (default {PERF_PAIRS['gpu']}, a dry run "
        f"{PERF_PAIRS['dry_run']}); after {PERF_PILOT_PAIRS['gpu']} pilot pairs, as many run as their spread needs "
        "for a ±2%% interval, while the budget holds them.",
    )
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = BUDGET_S["dry_run" if args.dry_run else "gpu"]
    if args.perf_pairs is not None and args.perf_pairs < 2:
        parser.error(f"--perf-pairs must be at least 2 (an interval needs two pair ratios), got {args.perf_pairs}.")
    return args


def part_deadlines(asked: list[str], deadline: float) -> dict[str, float]:
    """Each asked part's own deadline: the check's, less the minimum of every asked part after it."""
    order = [name for name in PART_MINIMUM_S if name in asked]
    return {name: deadline - sum(PART_MINIMUM_S[later] for later in order[i + 1 :]) for i, name in enumerate(order)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.time()
    deadline = started + args.budget_s
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: torch sees no CUDA GPU here; run it on a GPU machine, or add --dry-run.")
    report: dict[str, Any] = {
        "dry_run": args.dry_run,
        "device": device,
        "budget_s": args.budget_s,
        "parts": {},
        "notes": [],
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    if args.dry_run:
        report["notes"].append(
            "dry run: the 'device' is the CPU, so the risk-math comparison is CPU against CPU; "
            "it shows the code runs, not that CUDA agrees"
        )
    report["environment"] = environment_report(device)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu_check-dry-run-")) if args.dry_run else RESULTS_DIR)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        workdir = Path(tmp)
        checkpointing = {"off": (False,), "on": (True,), "both": (False, True)}[args.gradient_checkpointing]
        parts = {
            "risk_math": lambda until: check_risk_math(device),
            "training": lambda until: check_training_resume(device, workdir),
            "loss": lambda until: check_loss(device, workdir),
            "lora": lambda until: check_lora_resume(device, workdir),
            "deepspeed": lambda until: check_deepspeed(device, args.dry_run, workdir, until),
            "performance": lambda until: run_performance(
                device,
                args.dry_run,
                workdir,
                until,
                checkpointing_settings=checkpointing,
                models=tuple(args.perf_models),
                pairs=args.perf_pairs,
            ),
        }
        deadlines = part_deadlines(args.parts, deadline)
        for name, fn in parts.items():
            if name in args.parts:
                run_part(report, name, deadlines[name], fn, deadlines[name])
            else:
                report["parts"][name] = {"skipped": "not asked for (--parts)"}
            report["total_s"] = round(time.time() - started, 1)
            write_report(report, out)  # after every part: a device call cut short still returns what was done
    print(markdown_report(report))
    print(summary_line(report, write_report(report, out)), flush=True)
    return report


def write_report(report: dict[str, Any], out: Path) -> Path:
    """Write the JSON and markdown files; returns the JSON's path (also kept as ``report["written"]``)."""
    name = "gpu_check_dry_run" if report["dry_run"] else "gpu_check"
    out.mkdir(parents=True, exist_ok=True)
    report["written"] = str(out / f"{name}.json")
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown_report(report) + "\n")
    return out / f"{name}.json"


if __name__ == "__main__":
    main()
