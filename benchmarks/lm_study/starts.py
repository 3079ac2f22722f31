"""The exact protocol's two SFT starts, built once and committed with their SHA-256, so every run starts from the
same weights on any machine.

Why committed rather than rebuilt: SFT on CPU is deterministic on one machine (one torch thread, seeded init and data
order; ``tests/test_lm_exact.py`` rebuilds a short SFT twice and compares the weights bit for bit), but float rounding
differs between CPUs (vector width, kernel choice), the differences grow over a thousand Adam steps, and a stopping
rule that compares a measured score with a threshold turns a small difference into a different number of steps. The
old moderate start also checked its rule on a 16-sample *sampled* Pass@1 (800 samples, 0.44 against 0.4 at the
stop), so two machines could stop 100 steps apart; the rules here use the exact success probabilities instead, which
removes the sampling but not the rounding. Hence the files.

Where the weights live: in the repository's history, not its tracked tree (which stays small for a clone or a device
call). ``start.json`` records the weights' git blob id beside their SHA-256; :func:`checked_start` restores missing
weights with ``git cat-file`` and checks them. A shallow clone lacks the blob: ``git fetch --unshallow`` brings it.
To publish a new start, commit its ``model.safetensors`` once (``git add -f``), then untrack it in a later commit.

    python -m benchmarks.lm_study.starts            # build any start that is missing (minutes), print the hashes
    python -m benchmarks.lm_study.starts --restore  # restore the committed starts' weights from git history
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR

from .config import LMConfig
from .exact import pass_at_k, problem_probabilities
from .sft import build_init_model, sft_trainer
from .task import make_splits

STARTS_DIR = RESULTS_DIR / "lm_exact" / "starts"
WEIGHTS = "model.safetensors"
RECORD = "start.json"


REPOSITORY = RESULTS_DIR.parents[1]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_blob_id(path: Path) -> str:
    """The id git gives ``path``'s bytes as a blob (what ``git hash-object`` prints), so a start's record can name
    its weights in the repository's history before they are committed."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def restore_weights(start_dir: Path, repository: Path = REPOSITORY) -> Path:
    """Write ``start_dir``'s weights from the git blob its ``start.json`` records; a clear error when the
    repository's history does not hold it. The caller checks the SHA-256."""
    record = json.loads((start_dir / RECORD).read_text())
    blob = record.get("git_blob")
    if not blob:
        raise FileNotFoundError(
            f"{start_dir / WEIGHTS} is missing and {start_dir / RECORD} names no git blob to restore it from: build "
            "the starts with `python -m benchmarks.lm_study.starts` (a new build is a new start: record it)."
        )
    try:
        found = subprocess.run(
            ["git", "-C", str(repository), "cat-file", "blob", blob], capture_output=True, check=False
        )
    except FileNotFoundError:
        found = None
    if found is None or found.returncode != 0:
        why = "git is not installed" if found is None else found.stderr.decode(errors="replace").strip()
        raise FileNotFoundError(
            f"{start_dir / WEIGHTS} is missing and git cannot restore it from blob {blob} ({why}). The starts' "
            "weights live in the repository's history: in a shallow clone run `git fetch --unshallow`, in a copy "
            "without .git clone the repository."
        )
    partial = start_dir / f"{WEIGHTS}.partial"
    partial.write_bytes(found.stdout)
    os.replace(partial, start_dir / WEIGHTS)
    return start_dir / WEIGHTS


def weights_digest(model) -> str:
    """SHA-256 over every parameter's name, dtype, shape and bytes (independent of the file format)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def checked_start(start_dir: Path) -> Path:
    """``start_dir`` after checking its weights against the SHA-256 recorded next to them; a clear error otherwise."""
    record_path = start_dir / RECORD
    if not record_path.exists():
        raise FileNotFoundError(
            f"No committed start in {start_dir}: expected {RECORD}. Build the starts with "
            "`python -m benchmarks.lm_study.starts` (a new build is a new start: record it)."
        )
    if not (start_dir / WEIGHTS).exists():
        restore_weights(start_dir)
    recorded = json.loads(record_path.read_text())["sha256"]
    actual = sha256_of(start_dir / WEIGHTS)
    if actual != recorded:
        raise ValueError(
            f"{start_dir / WEIGHTS} has SHA-256 {actual}, but {RECORD} records {recorded}: the weights are not the "
            "committed start. Delete the file and run `python -m benchmarks.lm_study.starts --restore`; never run "
            "the study from them."
        )
    return start_dir


def train_start(
    cfg: LMConfig,
    base_dir: Path,
    out_dir: Path,
    *,
    seed: int,
    max_steps: int,
    check_every: int,
    stop_rule: Callable[[dict[str, list[float]]], bool],
    rule_text: str,
) -> dict[str, Any]:
    """SFT of ``base_dir`` with TRL's ``SFTTrainer`` on the task's fresh pairs (one torch thread), checked every
    ``check_every`` steps with the exact validation success probabilities; stops when ``stop_rule`` holds for them or
    after ``max_steps``. Saves the model and tokenizer in ``out_dir`` with ``start.json`` (rule, steps, history,
    SHA-256 of the weights, versions)."""
    import transformers
    import trl
    from transformers import TrainerCallback

    torch.set_num_threads(1)
    splits = make_splits(cfg)
    history: list[dict[str, Any]] = []

    def exact_val(model, tokenizer) -> dict[str, list[float]]:
        return problem_probabilities(
            model, tokenizer, splits.val, temperature=cfg.temperature, max_completion_length=cfg.max_completion_length
        )

    class StopByRule(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % check_every:
                return
            probs = exact_val(model, processing_class)
            model.train()
            entry = {
                "step": state.global_step,
                **{
                    b: {"pass@1": float(pass_at_k(p, 1).mean()), "pass@16": float(pass_at_k(p, 16).mean())}
                    for b, p in probs.items()
                },
            }
            history.append(entry)
            print(f"[start] step {state.global_step}: {entry}", flush=True)
            if stop_rule(probs):
                control.should_training_stop = True

    run_dir = out_dir.parent / "models" / f"{out_dir.name}_run"
    trainer = sft_trainer(cfg, splits, base_dir, run_dir, max_steps=max_steps, seed=seed, callback=StopByRule())
    tokenizer = trainer.processing_class
    started = time.perf_counter()
    trainer.train()
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    probs = exact_val(trainer.model, tokenizer)
    record = {
        "base": base_dir.name,
        "seed": seed,
        "rule": rule_text,
        "steps": trainer.state.global_step,
        "reached_rule": bool(stop_rule(probs)),
        "seconds": time.perf_counter() - started,
        "history": history,
        "sha256": sha256_of(out_dir / WEIGHTS),
        "git_blob": git_blob_id(out_dir / WEIGHTS),
        "weights_digest": weights_digest(trainer.model),
        "built_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    }
    (out_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def easy_pass16(cfg: LMConfig) -> Callable[[dict[str, list[float]]], bool]:
    easy = f"{min(cfg.digits)}digit"
    return lambda probs: float(pass_at_k(probs[easy], 16).mean()) >= cfg.sft_target_easy_pass16


def bucket_pass1(bucket: int, target: float) -> Callable[[dict[str, list[float]]], bool]:
    return lambda probs: float(pass_at_k(probs[f"{bucket}digit"], 1).mean()) >= target


def build_starts(protocol, out: Path = STARTS_DIR) -> dict[str, dict[str, Any]]:
    """Build whichever of the two starts is missing under ``out`` (``low``, then ``moderate`` from it)."""
    cfg = protocol.lm
    records = {}
    low, moderate = out / "low", out / "moderate"
    if not (low / RECORD).exists():
        init = out / "models" / "init"  # git ignores models/
        build_init_model(cfg, init)
        train_start(
            cfg,
            init,
            low,
            seed=0,
            max_steps=cfg.sft_max_steps,
            check_every=cfg.sft_eval_every,
            stop_rule=easy_pass16(cfg),
            rule_text=f"{min(cfg.digits)}digit validation exact Pass@16 >= {cfg.sft_target_easy_pass16}, "
            f"checked every {cfg.sft_eval_every} steps, at most {cfg.sft_max_steps} steps",
        )
    records["low"] = json.loads((checked_start(low) / RECORD).read_text())
    if not (moderate / RECORD).exists():
        train_start(
            cfg,
            low,
            moderate,
            seed=1,
            max_steps=protocol.moderate_max_steps,
            check_every=protocol.moderate_check_every,
            stop_rule=bucket_pass1(protocol.moderate_bucket, protocol.moderate_target_pass1),
            rule_text=f"{protocol.moderate_bucket}digit validation exact Pass@1 >= "
            f"{protocol.moderate_target_pass1}, checked every {protocol.moderate_check_every} "
            f"steps, at most {protocol.moderate_max_steps} more steps",
        )
    records["moderate"] = json.loads((checked_start(moderate) / RECORD).read_text())
    return records


if __name__ == "__main__":
    import argparse

    import datasets

    from .config import ExactProtocol

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restore", action="store_true", help="restore the committed starts' weights, build none")
    args = parser.parse_args()
    if args.restore:
        for name in ExactProtocol().starts:
            print(f"{name}: {checked_start(STARTS_DIR / name) / WEIGHTS}, SHA-256 checked")
        raise SystemExit(0)
    datasets.disable_progress_bars()
    for name, record in build_starts(ExactProtocol()).items():
        print(f"{name}: {record['steps']} steps, sha256 {record['sha256']}")
