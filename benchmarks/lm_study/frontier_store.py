"""The frontier study's run files: one gzip'd JSON per run, ``<out>/<start>/runs/<method>-lr<lr>-seed<seed>.json.gz``.

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

FORMAT = 1
SUFFIX = ".json.gz"


def run_file(out: Path, start: str, name: str) -> Path:
    return out / start / "runs" / f"{name}{SUFFIX}"


def rounded(probs: dict[str, list[float]], digits: int) -> dict[str, list[float]]:
    """Each bucket's probabilities to ``digits`` significant digits."""
    return {bucket: [float(f"{p:.{digits}g}") for p in values] for bucket, values in probs.items()}


def write_run(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps({"format": FORMAT, **payload}, separators=(",", ":")).encode()
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as zipped:
        zipped.write(data)
    tmp.replace(path)


def read_run(path: Path) -> dict[str, Any] | None:
    """The run's payload, or None when it has not finished."""
    if not path.exists():
        return None
    payload = json.loads(gzip.decompress(path.read_bytes()))
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} has format {payload.get('format')!r}; this code reads format {FORMAT}.")
    return payload
