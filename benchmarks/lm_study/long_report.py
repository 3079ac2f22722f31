"""Tables, figures and verdict numbers of the long-horizon protocol, from whatever runs have finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info, write_results

from .config import LongProtocol


def load_long_runs(out: Path, start: str) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / start / "runs").glob("*.json"))}


def report(protocol: LongProtocol, out: Path, starts: list[str], methods: list[str], wall: float | None = None):
    runs = {start: load_long_runs(out, start) for start in starts}
    lines = ["# Long-horizon tiny-LM study", ""]
    for start, rs in runs.items():
        lines.append(f"{start}: {len(rs)} runs finished: " + ", ".join(sorted(rs)))
    payload = {"machine": machine_info(), "wall_seconds": wall, "finished": {s: sorted(r) for s, r in runs.items()}}
    write_results("lm_long", payload, "\n".join(lines), out)
    return payload
