"""The files an evaluation writes as it goes, and resuming from them.

``samples.jsonl`` gets one line per scored problem; ``results.json`` / ``results.md`` are rewritten atomically after
every batch. Each record stores the sampling settings it was drawn with, so a resumed run can refuse to mix others.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .sampling import SamplingSettings

SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.json"
TABLE_FILE = "results.md"
# Settings that change what a problem's samples mean; a resumed run must use the ones its records were sampled with.
RESUME_SETTINGS = ("num_samples", "temperature", "top_p", "max_new_tokens")

# benchmark name -> problem index -> record
DoneRecords = dict[str, dict[int, dict[str, Any]]]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_done(path: Path) -> DoneRecords:
    """The records already in ``samples.jsonl`` (a last line cut short by a crash is skipped)."""
    done: DoneRecords = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a crash
                    continue
                done.setdefault(record["benchmark"], {})[record["index"]] = record
    return done


def check_earlier_samples(done: DoneRecords, path: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to start over silently on the records an earlier run left in ``path``: keeping them (``resume``) or
    deleting them (``overwrite``) is the user's call."""
    if not done or resume or overwrite:
        return
    count = sum(len(records) for records in done.values())
    raise ValueError(
        f"{path} already holds {count} scored problem(s) of an earlier run ({', '.join(sorted(done))}). "
        "--resume true (resume=True) keeps them and samples only the problems not yet scored; --overwrite true "
        "(overwrite=True) deletes them and starts over; or choose another --output_dir."
    )


def sampling_record(settings: SamplingSettings) -> dict[str, Any]:
    """The settings stored with each record, so a resumed run can check it samples the same way."""
    return {name: getattr(settings, name) for name in RESUME_SETTINGS}


def check_resumable(done: DoneRecords, settings: SamplingSettings, path: Path) -> None:
    """Refuse to resume when the records in ``path`` were sampled with other settings: mixing, say, n=4 and n=8
    samples per problem makes Pass@k meaningless (and fails for k above the smaller n)."""
    current = sampling_record(settings)
    for records in done.values():
        for record in records.values():
            # Records written before settings were stored still tell their n.
            recorded = record.get("sampling") or {"num_samples": len(record["scores"])}
            differing = [name for name in RESUME_SETTINGS if name in recorded and recorded[name] != current[name]]
            if differing:
                changes = ", ".join(f"{name}={recorded[name]} (now {current[name]})" for name in differing)
                raise ValueError(
                    f"resume=True, but {path} was sampled with {changes}. Resume with the same settings, or start "
                    "over: another output_dir, or overwrite=True (which replaces samples.jsonl)."
                )


def check_same_prompt_template(done: DoneRecords, prompt_template: str, path: Path) -> None:
    """Refuse to resume records whose problems were prompted with another template (records written before the
    template was stored were prompted with the default, the only one then)."""
    from ..data.prompts import DEFAULT_PROMPT_TEMPLATE

    for records in done.values():
        for record in records.values():
            recorded = record.get("prompt_template", DEFAULT_PROMPT_TEMPLATE)
            if recorded != prompt_template:
                raise ValueError(
                    f"resume=True, but {path} was prompted with prompt_template={recorded!r} (now "
                    f"{prompt_template!r}). Resume with the same template, or start over: another output_dir, or "
                    "overwrite=True."
                )
