"""What a RiskPO checkpoint holds besides TRL's, and how it loads.

- The advantage step's state (the quantile trackers, the regime guard) is written next to the optimizer, in
  ``riskpo_state.json``, atomically (:func:`write_state`, :func:`read_state`).
- The risk settings it was trained with (``"settings"`` in that file, :func:`risk_settings`): a resumed run must keep
  them, as they define the advantage the trackers' quantiles belong to; :func:`check_resume_settings` refuses a change
  before anything loads. What may change on resume: everything else (the schedule, ``max_steps``, the learning rate,
  the trackers' step size ``quantile_lr`` / ``quantile_lr_decay``, the guards, logging and saving).
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from ..risk.defaults import PAPER_ADVANTAGE_BASELINE, resolve_advantage_baseline
from .state_files import StateFileError, json_field, read_json_file, shown

RISK_STATE_FILE = "riskpo_state.json"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers' record of the checkpoint's step
MAX_STATE_BYTES = 1 << 20  # riskpo_state.json holds a few kilobytes
MAX_TRAINER_STATE_BYTES = 256 << 20  # trainer_state.json grows with the logged history

# RiskPOConfig's own fields that a resumed run may change: the trackers' step size and the run's guards. Every other
# field RiskPOConfig adds to GRPOConfig is a risk setting (a field added later is one unless listed here).
RESUMABLE_RISK_FIELDS = frozenset(
    {
        "quantile_lr",
        "quantile_lr_decay",
        "max_unscorable_batches",
        "regime_guard_threshold",
        "regime_guard_patience",
        "loss_token_mean_sequences",
    }
)


def risk_settings(args: Any) -> dict[str, Any]:
    """The settings of ``args`` (a RiskPOConfig) that a resumed run must keep: the fields RiskPOConfig adds to
    GRPOConfig, less :data:`RESUMABLE_RISK_FIELDS`."""
    from dataclasses import fields

    from trl import GRPOConfig

    inherited = {f.name for f in fields(GRPOConfig)}
    settings = {
        f.name: getattr(args, f.name)
        for f in fields(args)
        if f.name not in inherited and f.name not in RESUMABLE_RISK_FIELDS
    }
    # The baseline the run trains with: an unset one is recorded as what it resolves to.
    settings["advantage_baseline"] = resolve_advantage_baseline(args.advantage_baseline, args.advantage_scaling)
    return settings


def check_resume_settings(checkpoint: str, args: Any) -> None:
    """Raise a ValueError naming each risk setting that ``args`` changes from what ``checkpoint`` was trained with.
    A checkpoint written before the settings were recorded tells only its trackers' levels (risk_alpha, risk_beta);
    one without RiskPO's state is left to :func:`read_state`."""
    path = os.path.join(checkpoint, RISK_STATE_FILE)
    if not os.path.lexists(path):
        return
    state = _load_json(path, MAX_STATE_BYTES)
    saved = json_field(state, "settings", (dict, type(None)), path, _HINT)
    if saved is None:  # written before the settings were recorded: the trackers' levels tell risk_alpha, risk_beta
        tracker = json_field(state, "quantile_tracker", (dict, type(None)), path, _HINT)
        levels = json_field(tracker or {}, "levels", (list, type(None)), path, _HINT)
        if levels is not None and (
            len(levels) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in levels)
        ):
            raise StateFileError(
                f"{path}: field 'levels' must be [risk_alpha, risk_beta], got {shown(levels)}. {_HINT}"
            )
        saved = {} if levels is None else {"risk_alpha": levels[0], "risk_beta": levels[1]}
    current = risk_settings(args)
    changed = [name for name in saved if name in current and saved[name] != current[name]]
    if changed:
        was = ", ".join(f"{name}={shown(saved[name])}" for name in changed)
        now = ", ".join(f"{name}={shown(current[name])}" for name in changed)
        raise ValueError(
            f"{checkpoint} was trained with {was}; this run sets {now}. Risk settings define the advantage and its "
            "tracked quantiles, so a resumed run keeps them: set them back, or start a fresh run in another "
            "output_dir. What may change on resume: max_steps, the learning rate and its schedule, quantile_lr, "
            "quantile_lr_decay, the guards, logging and saving."
        )


def write_state(output_dir: str, state: dict[str, Any]) -> None:
    """Write ``state`` as ``output_dir/riskpo_state.json``; atomic, so a kill mid-write leaves no half-written file.
    A failed write (a full disk) removes its temporary file and raises an OSError naming the path and the cause."""
    path = os.path.join(output_dir, RISK_STATE_FILE)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(state, f, indent=2)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        try:
            os.unlink(path + ".tmp")
        except OSError:
            pass
        raise OSError(exc.errno, f"Could not write {path}: {exc.strerror or exc}", path) from exc


def read_state(checkpoint: str) -> dict[str, Any]:
    """The state :func:`write_state` wrote into ``checkpoint``; a checkpoint without one is refused by name."""
    path = os.path.join(checkpoint, RISK_STATE_FILE)
    if not os.path.lexists(path):
        raise FileNotFoundError(
            f"{checkpoint} has no {RISK_STATE_FILE}, so the quantile trackers cannot be restored. Resume from a "
            "checkpoint written by RiskPOTrainer, or start a fresh run."
        )
    return _load_json(path, MAX_STATE_BYTES)


_HINT = "Resume from another checkpoint, or start a fresh run."


def _load_json(path: str, max_bytes: int) -> dict[str, Any]:
    """The JSON object in ``path``, read by the start-up reader (`read_json_file`); anything else is refused in one
    line naming the file."""
    state = read_json_file(path, max_bytes, f"A checkpoint's state file is a small regular file: {_HINT}")
    if not isinstance(state, dict):
        raise StateFileError(f"{path} holds a JSON {type(state).__name__}, not an object: {_HINT}")
    return state


def max_training_batches(checkpoint: str, gradient_accumulation_steps: int) -> int | None:
    """The most training batches a run can have scored by ``checkpoint``: one per micro-batch of each step, the one
    in progress included; None where the step is unknown (`checkpoint_step`)."""
    step = checkpoint_step(checkpoint)
    return None if step is None else (step + 1) * max(1, gradient_accumulation_steps)


def checkpoint_step(checkpoint: str) -> int | None:
    """The step ``checkpoint`` was saved at: its folder's (``checkpoint-<step>``, as transformers names it) and the
    ``global_step`` of its trainer_state.json, which must agree when both are there (a renamed folder, or a forged
    step, would lift the bound on the restored state); None where neither says."""
    named = re.fullmatch(r"checkpoint-(\d{1,12})", os.path.basename(os.path.normpath(checkpoint)))
    path = os.path.join(checkpoint, TRAINER_STATE_FILE)
    recorded = None
    if os.path.lexists(path):
        recorded = json_field(_load_json(path, MAX_TRAINER_STATE_BYTES), "global_step", (int, type(None)), path)
        if recorded is not None and not 0 <= recorded < 10**12:
            raise StateFileError(f"{path}: field 'global_step' is {shown(recorded)}, not a step count. {_HINT}")
    if named and recorded is not None and int(named.group(1)) != recorded:
        raise StateFileError(
            f"{path}: field 'global_step' is {recorded}, but the folder is named for step {named.group(1)}: the "
            f"checkpoint was renamed or edited. {_HINT}"
        )
    if named:
        return int(named.group(1))
    return recorded


def restore_state(
    checkpoint: str, state: dict[str, Any], estimator: Any, regime_guard: Any, max_batches: int | None = None
) -> None:
    """Load ``state`` (:func:`read_state`) into the risk estimator and the regime guard. A state that would train on
    wrong quantiles (NaN, infinite, missing or unordered levels, an update count that is not positive or over
    ``max_batches``, estimates farther from the scores seen than the updates can move them) or a malformed guard
    state is refused, naming the file and the field, before any training step."""
    path = os.path.join(checkpoint, RISK_STATE_FILE)
    parts = [("quantile_tracker", functools.partial(estimator.load_state_dict, max_updates=max_batches), state)]
    if "regime_guard" in state:  # checkpoints written before the guard existed have none
        guard_load = functools.partial(regime_guard.load_state_dict, max_batches=max_batches)
        parts.append(("regime_guard", guard_load, state["regime_guard"]))
    for name, load, part in parts:
        try:
            load(part)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            reason = f"field {exc} is missing" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(
                f"{path} cannot be resumed from: in {name!r}, {reason}. The file is damaged or was "
                "edited: resume from another checkpoint, or start a fresh run."
            ) from exc


def resumed_baseline(state: dict[str, Any], args: Any) -> str | None:
    """The advantage baseline a resumed run must switch to, or None to keep its own: a checkpoint written before
    checkpoints recorded their risk settings was trained with the paper's advantage (``"none"``, the default then),
    so a run that does not state ``advantage_baseline`` goes on with it rather than with today's default."""
    if "settings" in state or args.advantage_baseline is not None:
        return None
    return PAPER_ADVANTAGE_BASELINE
