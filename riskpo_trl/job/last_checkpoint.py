"""The checkpoint a run resumes from: the last one in ``output_dir`` whose save finished. Plain Python, so that
``riskpo-train`` can tell a finished run before torch and TRL load."""

from __future__ import annotations

import os
import re

# A checkpoint's trainer state is written last, so a checkpoint without it was cut short while saving.
CHECKPOINT_COMPLETE_MARKER = "trainer_state.json"


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The last ``checkpoint-N`` in ``output_dir`` whose save finished (it has its trainer state, written last), or
    None; later ones that a kill cut short are named in a warning and skipped."""
    import logging

    names = [
        name
        for name in os.listdir(output_dir)
        if re.fullmatch(r"checkpoint-\d+", name) and os.path.isdir(os.path.join(output_dir, name))
    ]
    folders = [os.path.join(output_dir, name) for name in sorted(names, key=lambda n: -int(n.split("-")[1]))]
    complete = next((path for path in folders if os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_MARKER))), None)
    skipped = folders[: folders.index(complete)] if complete else folders
    if skipped:
        logging.getLogger(__name__).warning(
            f"Skipping {', '.join(skipped)}: no {CHECKPOINT_COMPLETE_MARKER}, so a kill cut its save short. "
            + (f"Resuming from {complete}." if complete else "Starting from scratch.")
        )
    return complete
