"""Which data a run trains on: what a command line's data source replaces in its recipe, and the record each
checkpoint keeps of it, so that a later command asking for other data in the same ``output_dir`` is told so in one
line instead of silently resuming (or skipping) the run on the data it was started with.

The record is a stateful callback's state in ``trainer_state.json``, which every checkpoint and the final save already
write (transformers' ``stateful_callbacks``); nothing restores it, it is only read back here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .recipe_values import command_line_fields

# A recipe's settings for its own training data: a data source given on the command line replaces them.
RECIPE_DATA_FIELDS = ("dataset_name", "dataset_files", "dataset_config", "dataset_train_split", "max_train_samples")
# What names the rows a run trains on (max_train_samples only trims them).
RECORDED_FIELDS = ("dataset_name", "dataset_config", "dataset_train_split", "dataset_files")
MAX_TRAINER_STATE_BYTES = 256 << 20  # trainer_state.json grows with the logged history
RECORD_NAME = "TrainingDataRecord"  # the callback's class name: its key in trainer_state.json's stateful_callbacks


def recipe_for_command_line(recipe: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """``recipe`` without its data settings when the command line names its own data: ``--dataset_name`` replaces
    every one of :data:`RECIPE_DATA_FIELDS`; ``--dataset_files`` alone keeps the recipe's ``dataset_name`` (the schema
    the files are read in) and replaces the rest. A field the command line sets itself wins as usual."""
    given = set(command_line_fields(argv))
    if "dataset_name" in given:
        replaced = set(RECIPE_DATA_FIELDS)
    elif "dataset_files" in given:
        replaced = set(RECIPE_DATA_FIELDS) - {"dataset_name"}
    else:
        return recipe
    return {name: value for name, value in recipe.items() if name not in replaced}


def data_record(script_args: Any) -> dict[str, Any]:
    """Where the run's rows come from, with local paths made absolute (a run may be resumed from anywhere)."""
    record = {name: getattr(script_args, name) for name in RECORDED_FIELDS}
    if record["dataset_files"]:
        record["dataset_files"] = [os.path.realpath(path) for path in record["dataset_files"]]
    if os.path.isdir(record["dataset_name"]):
        record["dataset_name"] = os.path.realpath(record["dataset_name"])
    return record


def recorded_data(checkpoint: str) -> dict[str, Any] | None:
    """The data record of ``checkpoint``'s ``trainer_state.json``, or None (no such file, a run from before it was
    recorded, or one not started by riskpo-train). The file is read by the start-up reader
    (`riskpo_trl.trainer.state_files.read_json_file`: no link, FIFO or device, size cap, bounded nesting) and each
    field is type-checked: a damaged file is refused in one line naming it and the field."""
    from ..trainer.state_files import json_field, read_json_file

    path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.lexists(path):
        return None
    hint = "Resume from another checkpoint, or start a fresh run in another output_dir."
    state = read_json_file(path, MAX_TRAINER_STATE_BYTES, hint)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a JSON {type(state).__name__}, not an object. {hint}")
    callbacks = json_field(state, "stateful_callbacks", (dict, type(None)), path, hint) or {}
    record = json_field(callbacks, RECORD_NAME, (dict, type(None)), path, hint)
    if record is None:
        return None
    args = json_field(record, "args", dict, path, hint)
    for name in RECORDED_FIELDS:
        kinds = (list, type(None)) if name == "dataset_files" else (str, type(None))
        json_field(args, name, kinds, path, hint)
    if any(not isinstance(item, str) for item in args.get("dataset_files") or []):
        raise ValueError(f"{path}: field 'dataset_files' must be a list of paths. {hint}")
    return args


def describe(record: dict[str, Any]) -> str:
    """``json (rows.jsonl)`` or ``gsm8k (examples/data/tiny_arithmetic.jsonl; split test)``: paths shown relative to
    the working directory when under it."""

    def shown(path: str) -> str:
        relative = os.path.relpath(path) if os.path.isabs(path) else path
        return path if relative.startswith("..") else relative

    name = record.get("dataset_name")
    details = [shown(path) for path in record.get("dataset_files") or []]
    details += [
        f"{label} {record[key]}"
        for key, label in (("dataset_config", "config"), ("dataset_train_split", "split"))
        if record.get(key) not in (None, "train")
    ]
    text = shown(name) if isinstance(name, str) and os.path.isabs(name) else str(name)
    return text + (f" ({'; '.join(details)})" if details else "")


def check_same_data(checkpoint: str, script_args: Any, output_dir: str) -> None:
    """Raise a ValueError, in one line, when ``checkpoint`` was trained on other data than this command asks for:
    resuming it would mix the two, and a finished run would not train at all."""
    recorded = recorded_data(checkpoint)
    asked = data_record(script_args)
    if recorded is None or {name: recorded.get(name) for name in RECORDED_FIELDS} == asked:
        return
    raise ValueError(
        f"{output_dir} holds a run trained on {describe(recorded)}; this command asks for {describe(asked)}. To train "
        f"on it, start a new run: give another --output_dir (or remove {output_dir})."
    )


def record_training_data(trainer: Any, script_args: Any) -> None:
    """Add the callback whose state records the run's data in every ``trainer_state.json`` the trainer writes."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    record = data_record(script_args)

    class TrainingDataRecord(TrainerCallback, ExportableState):
        def __init__(self, **recorded):  # what restore_callback_states_from_checkpoint passes back; not used
            super().__init__()

        def state(self) -> dict:
            return {"args": record, "attributes": {}}

    trainer.add_callback(TrainingDataRecord())
