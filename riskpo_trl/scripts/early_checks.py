"""``riskpo-train``'s checks that need no model, torch or TRL, run before those load: the batch and bundle
arithmetic, the model path, local dataset files and their columns (read without `datasets`), the output directory's
lock, and whether the run there is already finished. Each gives the message of the check that runs later, at once
instead of after the seconds those imports take (benchmarks/cli_startup.py measures both).

They take the option values the light parser read (riskpo_trl.scripts.known_options), with each trainer's defaults of
the layout fields from the generated list. What cannot be decided here is left to the later checks, which all stay in
place: other TRL or transformers versions than the list's, a registered or Hub dataset, a file this reader does not
read (compressed, or over 64 MB), the reward functions' own columns, and, with several processes, the lock and the
finished run (only the main process may look at them).
"""

from __future__ import annotations

import argparse
import os
import shutil

from ..data.columns import training_renames
from ..data.local_files import check_data_files, peek_columns
from ..data.user_datasets import FILE_FORMATS
from ..trainer.batch_layout import bundle_layout_error
from ..trainer.checks import check_generation_batch_fits, check_model_path, missing_prompt_message
from ..trainer.last_checkpoint import last_complete_checkpoint
from ..trainer.run_lock import LOCK_FILE, acquire
from .run_data import MAX_TRAINER_STATE_BYTES, check_same_data

# What a checkpoint holds besides the model files that save_model writes into output_dir.
TRAINING_STATE_FILES = (
    "optimizer.pt",
    "scheduler.pt",
    "rng_state",
    "training_args.bin",
    "riskpo_state.json",
    "global_step",
    "latest",
    "zero_to_fp32.py",
)


def with_layout_defaults(values: argparse.Namespace, trainer: str) -> argparse.Namespace | None:
    """``values`` with the layout fields it does not set at ``trainer``'s defaults (the generated list's), or None
    when the list has none for it."""
    from . import known_options_data

    defaults = known_options_data.LAYOUT.get(trainer)
    if defaults is None:
        return None
    filled = argparse.Namespace(**vars(values))
    for name, default in defaults.items():
        if getattr(filled, name, None) is None:
            setattr(filled, name, default)
    return filled


def processes() -> int:
    """The number of processes ``accelerate launch`` (or torchrun) started, from the environment it sets."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def generation_layout(values: argparse.Namespace) -> argparse.Namespace | None:
    """``values`` with ``world_size``, ``steps_per_generation`` and ``generation_batch_size`` as GRPOConfig derives
    them; None for a layout GRPOConfig itself refuses, which is left to it."""
    world_size = processes()
    per_step = values.per_device_train_batch_size * world_size
    steps, batch = values.steps_per_generation, values.generation_batch_size
    if steps is None and batch is None:
        steps = values.steps_per_accumulation * values.gradient_accumulation_steps
    if batch is None:
        batch = per_step * steps
    elif steps is not None or batch % per_step != 0:
        return None
    else:
        steps = batch // per_step
    if values.num_generations < 2 or batch % values.num_generations != 0:
        return None
    derived = argparse.Namespace(**vars(values))
    derived.world_size, derived.steps_per_generation, derived.generation_batch_size = world_size, steps, batch
    return derived


def check_bundle_layout(values: argparse.Namespace) -> None:
    """RiskPOConfig's batch-layout check (a trainer without bundles has nothing to check)."""
    layout = generation_layout(values)
    if layout is None or getattr(values, "bundle_size", None) is None or values.bundle_size < 1:
        return
    problem = bundle_layout_error(layout.generation_batch_size, layout.num_generations, layout.bundle_size)
    if problem is not None:
        raise ValueError(problem)


def check_model_name(values: argparse.Namespace) -> None:
    """A missing local model path, unless build_tiny_model (or build_tiny_vlm) is to build it."""
    path = values.model_name_or_path
    if path and not (values.build_tiny_model or values.build_tiny_vlm):
        check_model_path(path, "model_name_or_path")


def check_local_data(values: argparse.Namespace) -> None:
    """Local files used as they are (dataset_name json, csv or parquet): the prompt and answer columns named exist,
    the rows have a prompt, and there are enough of them for one generation batch."""
    name = values.dataset_name
    if name not in FILE_FORMATS or not values.dataset_files:
        return
    found = peek_columns(check_data_files(values.dataset_files, reader=name))
    if found is None:
        return
    columns, rows = found
    renames = training_renames(columns, values.prompt_column, values.answer_column, f"the training dataset {name!r}")
    read_as = {source: target for target, source in renames.items()}
    columns = [read_as.get(column, column) for column in columns]
    if "prompt" not in columns:
        raise ValueError(missing_prompt_message("training", columns))
    layout = generation_layout(values)
    if layout is not None:
        limit = values.max_train_samples
        check_generation_batch_fits(range(rows if limit is None else min(rows, limit)), layout)


def check_output_dir(values: argparse.Namespace) -> str | None:
    """Refuse an output_dir another run holds, or a run there on other data; return the "Nothing to train" line when
    its last checkpoint already finished the run asked for (after restoring a missing final save from it)."""
    output_dir = values.output_dir
    if not output_dir or not os.path.isdir(output_dir) or processes() > 1:
        return None
    if os.path.lexists(os.path.join(output_dir, LOCK_FILE)):
        acquire(output_dir).release()  # raises naming the run that holds it; a stale lock is taken over
    checkpoint = values.resume_from_checkpoint or last_complete_checkpoint(output_dir)
    if checkpoint is None:
        return None
    check_same_data(checkpoint, values, output_dir)
    finished = finished_run(checkpoint, values)
    if finished is None:
        return None
    return nothing_to_train(output_dir, finished, restore_final_save(checkpoint, output_dir))


def nothing_to_train(output_dir: str, finished: str, restored: bool) -> str:
    return (
        f"Nothing to train: the run in {output_dir} is finished ({finished})"
        f"{'; its final model was copied from that checkpoint' if restored else ''}. Raise max_steps (or "
        "num_train_epochs) to train further, or choose another output_dir."
    )


def finished_run(checkpoint: str | None, training_args) -> str | None:
    """Why ``checkpoint`` already ends the run this command asks for (it reached ``max_steps``, or trained all the
    epochs), or None. Resuming such a checkpoint would take one more step (transformers checks the end only after a
    step)."""
    from ..trainer.state_files import json_field, read_json_file

    state_file = os.path.join(checkpoint or "", "trainer_state.json")
    if checkpoint is None or not os.path.lexists(state_file):
        return None
    hint = "Resume from another checkpoint, or start a fresh run in another output_dir."
    state = read_json_file(state_file, MAX_TRAINER_STATE_BYTES, hint)  # no FIFO, device or link; bounded
    if not isinstance(state, dict):
        raise ValueError(f"{state_file} holds a JSON {type(state).__name__}, not an object. {hint}")
    step = json_field(state, "global_step", (int, type(None)), state_file, hint) or 0
    if training_args.max_steps > 0:
        if step >= training_args.max_steps:
            return f"{checkpoint} is at step {step} of max_steps={training_args.max_steps}"
        return None
    epoch = json_field(state, "epoch", (int, float, type(None)), state_file, hint) or 0.0
    run_steps = json_field(state, "max_steps", (int, type(None)), state_file, hint)
    if step >= (float("inf") if run_steps is None else run_steps) and epoch >= training_args.num_train_epochs - 1e-6:
        return f"{checkpoint} has trained {epoch:g} of num_train_epochs={training_args.num_train_epochs:g}"
    return None


def restore_final_save(checkpoint: str, output_dir: str) -> bool:
    """If ``output_dir`` lacks the final save (a run killed between its last checkpoint and the end), copy the model
    files and the trainer state from ``checkpoint``, which holds the same weights; True if it copied."""
    if any(os.path.isfile(os.path.join(output_dir, name)) for name in ("config.json", "adapter_config.json")):
        return False
    for name in os.listdir(checkpoint):
        source = os.path.join(checkpoint, name)
        if os.path.isfile(source) and not name.startswith(TRAINING_STATE_FILES):
            shutil.copy2(source, os.path.join(output_dir, name))
    return True
