"""The frontier study's run files: one gzip'd JSON per run, ``<out>/<start>/runs/<method>-lr<lr>-seed<seed>.json.gz``,
read through :func:`benchmarks._common.read_json`, so a run folded into the study's pack (``benchmarks/store.py``)
reads the same and counts as cached. A run's name is its plain ``.json`` path, as for every study.

Every read and write of a run goes through here, so the format can change in one place. A file holds what the
report and an outside recomputation need: the settings, each checkpoint's exact per-problem probabilities
(``stored_digits`` significant digits) and sampled entropy, the final test entropy, the reward per generation batch,
timing and load. Written atomically: a killed run leaves nothing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from benchmarks._common import json_exists, read_json

FORMAT = 1


def run_file(out: Path, start: str, name: str) -> Path:
    """The run's name: its plain ``.json`` path (written gzip'd, next to it, as ``.json.gz``)."""
    return out / start / "runs" / f"{name}.json"


def rounded(probs: dict[str, list[float]], digits: int) -> dict[str, list[float]]:
    """Each bucket's probabilities to ``digits`` significant digits."""
    return {bucket: [float(f"{p:.{digits}g}") for p in values] for bucket, values in probs.items()}


def write_run(path: Path, payload: dict[str, Any]) -> None:
    path = path.with_name(path.name + ".gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps({"format": FORMAT, **payload}, separators=(",", ":")).encode()
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as zipped:
        zipped.write(data)
    tmp.replace(path)


def read_run(path: Path) -> dict[str, Any] | None:
    """The run's payload, or None when it has not finished."""
    if not json_exists(path):
        return None
    payload = read_json(path)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} has format {payload.get('format')!r}; this code reads format {FORMAT}.")
    return payload
