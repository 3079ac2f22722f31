"""Saving and resuming checkpoints in the layouts users run, for whichever trainer a job builds (`guard_checkpoints`).

- A full disk: a checkpoint save that fails for want of space names the folder and the cause
  (:func:`checkpoint_write_error`); torch reports one as ``RuntimeError: basic_ios::clear: iostream error``.
- Tied weights on resume: a checkpoint stores a tied weight once (``lm_head.weight`` is the embedding's tensor in a
  model with ``tie_word_embeddings``), so loading it with ``strict=False`` lists the tied copy as missing although it
  already holds the loaded values; the resume warning keeps real gaps only (:func:`without_tied_missing_keys`).
- The optimizer's device on resume: with more than one process transformers loads the optimizer state onto
  ``args.device``, which on CPU is ``cpu:0``, a location torch cannot restore to ("don't know how to restore data
  location ... (tagged with cpu:0)", transformers 5.17); :func:`accept_indexed_cpu_locations` lets torch load onto
  any ``cpu:N``.

Each wraps one of transformers' checkpoint methods on the trainer object, not its class: messages and loading only,
no value a run trains with changes.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

_FULL_DISK_ERRNOS = {28: "no space left on device", 122: "disk quota exceeded", 30: "read-only file system"}
FULL_DISK_BYTES = 1 << 20  # free space below this after a failed save: the disk is full
_INDEXED_CPU = re.compile(r"cpu:\d+")


def guard_checkpoints(trainer: Any) -> None:
    """Wrap ``trainer``'s ``_save_checkpoint``, ``_issue_warnings_after_load`` and ``_load_optimizer_and_scheduler``
    with the module's three guard rails."""
    save, warn_after_load, load_optimizer = (
        trainer._save_checkpoint,
        trainer._issue_warnings_after_load,
        trainer._load_optimizer_and_scheduler,
    )

    def save_checkpoint(model, trial):
        try:
            return save(model, trial)
        except (OSError, RuntimeError) as exc:  # a full disk: name the place and the cause (torch.save names neither)
            error = checkpoint_write_error(exc, trainer.args.output_dir)
            if error is exc:
                raise
            raise error from exc

    def issue_warnings_after_load(load_result):
        return warn_after_load(without_tied_missing_keys(trainer.model, load_result))

    def load_optimizer_and_scheduler(checkpoint):
        if checkpoint is not None:
            accept_indexed_cpu_locations()
        return load_optimizer(checkpoint)

    trainer._save_checkpoint = save_checkpoint
    trainer._issue_warnings_after_load = issue_warnings_after_load
    trainer._load_optimizer_and_scheduler = load_optimizer_and_scheduler


def checkpoint_write_error(exc: BaseException, output_dir: str) -> BaseException:
    """``exc`` as an OSError naming where the checkpoint was being written and why, when the disk is the reason: an
    OSError of a full, over-quota or read-only disk, or any failure of the save (torch.save reports one as
    ``RuntimeError: basic_ios::clear: iostream error``, with no path and no errno) while ``output_dir``'s file system
    has less than `FULL_DISK_BYTES` free or is read-only. Else ``exc`` itself."""
    errno_ = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and errno_ in _FULL_DISK_ERRNOS:
        cause = _FULL_DISK_ERRNOS[errno_]
    else:
        try:
            disk = os.statvfs(output_dir)
        except OSError:
            return exc
        if disk.f_flag & os.ST_RDONLY:
            errno_, cause = 30, _FULL_DISK_ERRNOS[30]
        elif disk.f_bavail * disk.f_frsize < FULL_DISK_BYTES:
            errno_, cause = 28, f"{_FULL_DISK_ERRNOS[28]} ({disk.f_bavail * disk.f_frsize} bytes free)"
        else:
            return exc
    return OSError(
        errno_,
        f"Could not write a checkpoint in {output_dir}: {cause} ({type(exc).__name__}: {str(exc)[:200]}). Free space "
        "there, or keep fewer checkpoints (save_total_limit); a resume takes the last complete checkpoint (one cut "
        "short is skipped)",
        output_dir,
    )


def without_tied_missing_keys(model: Any, load_result: Any) -> Any:
    """``load_result`` (a ``load_state_dict`` result) without the missing keys of parameters that are the very tensor
    of a loaded one (``lm_head.weight`` in a tied-embeddings model): loading the one loaded the other."""
    names_by_tensor: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_by_tensor.setdefault(id(parameter), []).append(name)
    missing = set(load_result.missing_keys)
    loaded_through_a_tie = {
        name
        for names in names_by_tensor.values()
        if any(other not in missing for other in names)
        for name in names
        if name in missing
    }
    return load_result._replace(
        missing_keys=[key for key in load_result.missing_keys if key not in loaded_through_a_tie]
    )


@functools.cache
def accept_indexed_cpu_locations() -> None:
    """Teach ``torch.load`` the locations ``cpu:0``, ``cpu:1``, ...: a storage loaded for one of them stays in CPU
    memory, as for ``cpu`` (torch knows only ``cpu``, and refuses a ``map_location`` of ``cpu:0``). Once per
    process."""
    from torch.serialization import register_package

    def restore_on_cpu(storage: Any, location: str) -> Any:
        return storage if _INDEXED_CPU.fullmatch(location) else None  # None: torch asks the next package

    register_package(100, lambda storage: None, restore_on_cpu)  # tags nothing when saving
