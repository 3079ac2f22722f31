"""The GPU check: one command that checks this package on a CUDA GPU and measures RiskPO against GRPO there.

    python -m benchmarks.gpu_wheels install --wheels .whl     # first, on the GPU machine (it has no network)
    python -m benchmarks.gpu_check --out "$OUT"               # about 6 minutes on one H100
    python -m benchmarks.gpu_check --dry-run                  # the same code on CPU with tiny models, < 5 minutes

Parts, in this order, each run only if the time budget (``--budget-s``) still holds it, else skipped with a note:

1. Environment: versions of torch, CUDA, transformers, accelerate, peft, TRL, datasets and math-verify, the GPU and
   its driver, and what the package's pins make of them. Releases outside the tested range are run anyway with
   RISKPO_ALLOW_UNTESTED_VERSIONS=1, and the output says so.
2. Risk math: every combination of the names in the risk registries that ``RiskEstimator`` takes (bundling, risk
   profile, advantage scaling, quantile source, credit rule, and any registry added later) and of its on/off switches,
   stepped on the same reward batches on the GPU and on the CPU: bundles, tracker, advantages and metrics must agree.
3. Training: the tiny model trained 4 steps in bf16 on the GPU, and again from its step-2 checkpoint: steps 3 and 4
   must repeat exactly (tracker, bundles, completions, advantages); the weights' largest difference is reported.
4. Loss: TRL's sequence-level loss and its gradients on the GPU against the direct implementation of the paper's
   objective in tests/test_loss.py (in fp32, with that test's tolerances).
5. Performance: ``benchmarks.overhead`` on random-weight models with the sizes of Qwen2.5-0.5B and Qwen2.5-1.5B,
   transformers generation, bf16, the paper's batch shape scaled down: step-time and peak-memory ratios over at least
   5 interleaved GRPO/RiskPO pairs, RiskPO's own time per step and completion tokens per second; then the same with
   gradient checkpointing while time is left.

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
# a few seconds a step: 10 prompts (two bundle groups) x 10 completions, 64 tokens; random weights never stop early,
# so every completion has the full length.
PERF_FLAGS = [
    "--num-generations",
    "10",
    "--prompts-per-step",
    "10",
    "--bundle-size",
    "5",
    "--pairs",
    "5",
    "--steps",
    "4",
    "--warmup",
    "1",
    "--threads",
    "4",
    "--in-process",
]
PERF_LENGTH = {"gpu": 64, "dry_run": 8}
# Seconds a part needs at least; a part starts only with that much of the budget left.
PART_MINIMUM_S = {"risk_math": 20, "training": 45, "loss": 15, "performance": 60}


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


def check_training_resume(device: str, workdir: Path) -> dict[str, Any]:
    """Train the tiny model 4 steps in bf16 on ``device``, then again from the step-2 checkpoint; steps 3 and 4 must
    repeat exactly."""
    import torch
    from transformers import TrainerCallback

    from benchmarks.overhead import digit_reward, prompts
    from riskpo_trl import RiskPOConfig, RiskPOTrainer
    from riskpo_trl.tiny_model import build_tiny_model

    model_dir = workdir / "tiny-model"
    build_tiny_model(model_dir)

    class Recorder(TrainerCallback):
        def __init__(self, trainer):
            self.trainer, self.latest, self.steps = trainer, None, {}

        def observe(self, scored):
            self.latest = scored

        def on_step_end(self, args, state, control, **kwargs):
            scored = self.latest
            self.steps[state.global_step] = {
                "tracker": self.trainer.quantile_tracker.values.clone(),
                "advantages": scored.risk.advantages.detach().cpu().clone(),
                "bundle_ids": scored.risk.bundle_ids.detach().cpu().clone(),
                "completion_ids": scored.outputs["completion_ids"].detach().cpu().clone(),
            }

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
            str(model_dir), reward_funcs=digit_reward, args=RiskPOConfig(**settings), train_dataset=prompts(20)
        )
        recorder = Recorder(trainer)
        trainer.add_callback(recorder)
        trainer.add_batch_observer(recorder.observe)
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        trainer.recorder = recorder
        return trainer

    full = train(workdir / "full", save_strategy="steps", save_steps=2)
    resumed = train(workdir / "resumed", resume_from=workdir / "full" / "checkpoint-2")
    differing = [
        f"step {step}: {key}"
        for step in (3, 4)
        for key in ("tracker", "bundle_ids", "completion_ids", "advantages")
        if not torch.equal(full.recorder.steps[step][key], resumed.recorder.steps[step][key])
    ]
    weights = max(
        (a.float() - b.float()).abs().max().item()
        for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values())
    )
    losses = [e["loss"] for e in full.state.log_history if "loss" in e]
    return {
        "ok": not differing and all(math.isfinite(loss) for loss in losses),
        "device": str(full.model.device),
        "mixed_precision": str(full.accelerator.mixed_precision),
        "model_dtype": str(full.model.dtype),
        "losses": losses,
        "resumed_steps_differing": differing,
        "largest_weight_difference_after_step_4": weights,
    }


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
    checkpointing_settings: tuple[bool, ...] = (False, True),
) -> dict[str, Any]:
    """benchmarks.overhead for each model, without and then with gradient checkpointing, while time is left."""
    import torch

    from benchmarks import overhead

    sizes = DRY_RUN_SIZES if dry_run else QWEN25_SIZES
    length = PERF_LENGTH["dry_run" if dry_run else "gpu"]
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
        }
        if summary["pairs_done"] < 5:
            notes.append(f"{label}: only {summary['pairs_done']} pair(s) fitted the time budget")
        if device == "cuda":
            torch.cuda.empty_cache()
    return {
        "ok": bool(results),
        "results": results,
        "notes": notes,
        "batch_shape": "10 prompts x 10 completions per step, bundles of 5, completions of "
        f"{length} tokens (the paper: 512 x 10, bundles of 5, up to 3072 tokens)",
    }


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
    ):
        result = report["parts"].get(part, {})
        details = describe(result) if "ok" in result else ""
        lines.append(f"| {part.replace('_', ' ')} | {verdict(result)} | {details} |")
    performance = report["parts"].get("performance", {})
    if performance.get("results"):
        lines += [
            "",
            f"RiskPO against GRPO, same settings ({performance['batch_shape']}; sequence-level ratio, loss_type grpo, "
            "beta 0, one update per generation batch, transformers generation, bf16 where the GPU has it). Ratios "
            "are RiskPO / GRPO, the median of the per-pair ratios; step times and tokens/s are medians over runs.",
            "",
            "| model | grad. ckpt | pairs | GRPO step (ms) | RiskPO step (ms) | step-time ratio | peak memory GRPO / "
            "RiskPO (MiB) | memory ratio | RiskPO's own work (ms/step) | tokens/s GRPO / RiskPO |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for result in performance["results"].values():
            s = result["summary"]
            memory = s.get("peak_cuda_allocated_mib")
            tokens = s.get("completion_tokens_per_s")
            lines.append(
                f"| {result['model']} | {'on' if result['gradient_checkpointing'] else 'off'} | {s['pairs_done']} | "
                f"{1e3 * s['step_time_s']['grpo']:.0f} | {1e3 * s['step_time_s']['riskpo']:.0f} | "
                f"{s['step_time_s']['median_pair_ratio']:.3f} | "
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
        figures.append(
            f"{result['model']}{' ckpt' if result['gradient_checkpointing'] else ''} step x"
            f"{s['step_time_s']['median_pair_ratio']:.3f}"
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
        "(default 330 on a GPU, 240 in a dry run).",
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
        default="both",
        help="The performance part's settings: without gradient checkpointing, with it, or both (default: off, then "
        "on, while time is left).",
    )
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 240.0 if args.dry_run else 330.0
    return args


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
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        workdir = Path(tmp)
        checkpointing = {"off": (False,), "on": (True,), "both": (False, True)}[args.gradient_checkpointing]
        parts = {
            "risk_math": (check_risk_math, device),
            "training": (check_training_resume, device, workdir),
            "loss": (check_loss, device, workdir),
            "performance": (run_performance, device, args.dry_run, workdir, deadline, checkpointing),
        }
        for name, (fn, *fn_args) in parts.items():
            if name in args.parts:
                run_part(report, name, deadline, fn, *fn_args)
            else:
                report["parts"][name] = {"skipped": "not asked for (--parts)"}
    report["total_s"] = round(time.time() - started, 1)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu_check-dry-run-")) if args.dry_run else RESULTS_DIR)
    out.mkdir(parents=True, exist_ok=True)
    name = "gpu_check_dry_run" if args.dry_run else "gpu_check"
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown_report(report) + "\n")
    print(markdown_report(report))
    print(summary_line(report, out / f"{name}.json"), flush=True)
    report["written"] = str(out / f"{name}.json")
    return report


if __name__ == "__main__":
    main()
