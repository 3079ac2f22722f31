"""Small helpers shared by the benchmarks: machine description, result files, mean and std, headless figures.

Run files. A study caches each run as one JSON file (``runs/<name>.json``). Committed, a study's runs live in one
pack, ``<study>/runs.parquet`` (:mod:`benchmarks.store`); a loose file may also be gzip'd (``runs/<name>.json.gz``,
written by :func:`compact_json_files`). Every study reads and lists run files through :func:`read_json`,
:func:`json_exists` and :func:`json_files`, which take the plain name and accept every form (a loose plain file
first, then its ``.gz``, then the pack), so a run written plain by a study in progress reads the same.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, load, library versions."""
    import torch
    import transformers
    import trl

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "platform": platform.platform(),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_results(name: str, payload: dict[str, Any], markdown: str, out_dir: Path | None = None) -> Path:
    """Write ``<name>.json`` and ``<name>.md`` under ``out_dir`` and return the JSON path."""
    out_dir = Path(out_dir or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(markdown.rstrip() + "\n")
    return json_path


def _existing(path: Path) -> Path | None:
    """``path`` (a ``.json`` name) or its gzip'd form ``path.gz``, whichever exists (the plain one first)."""
    path = Path(path)
    if path.exists():
        return path
    packed = path.with_name(path.name + ".gz")
    return packed if packed.exists() else None


def json_exists(path: Path) -> bool:
    """Whether the JSON file ``path`` exists: plain, gzip'd, or in a pack of a folder above it."""
    from benchmarks.store import find_packed

    return _existing(path) is not None or find_packed(path) is not None


def read_json(path: Path) -> Any:
    """The JSON file ``path``: plain, gzip'd (``path.gz``) or packed, in that order; FileNotFoundError naming
    ``path`` when none exists."""
    from benchmarks.store import find_packed

    found = _existing(path)
    if found is None:
        packed = find_packed(path)
        if packed is None:
            raise FileNotFoundError(f"{path} (nor {Path(path).name}.gz, nor a packed copy) does not exist")
        pack, name = packed
        return pack.read(name)
    data = gzip.decompress(found.read_bytes()) if found.suffix == ".gz" else found.read_bytes()
    return json.loads(data.decode())


def json_files(directory: Path, pattern: str = "*.json") -> list[Path]:
    """The JSON files in ``directory`` matching ``pattern``, plain, gzip'd or packed, each by its plain name,
    sorted."""
    from benchmarks.store import packed_files

    directory = Path(directory)
    names = {p.name for p in directory.glob(pattern)}
    names |= {p.name.removesuffix(".gz") for p in directory.glob(pattern + ".gz")}
    names |= packed_files(directory, pattern)
    return [directory / name for name in sorted(names)]


def compact_json_files(paths: Sequence[Path]) -> int:
    """Replace each plain JSON file of ``paths`` by its gzip'd form ``<name>.json.gz`` (same content; level 9, no
    name or time in the header, so the bytes depend on the content only); returns the bytes saved."""
    saved = 0
    for path in map(Path, paths):
        raw = path.read_bytes()
        packed = gzip.compress(raw, compresslevel=9, mtime=0)
        path.with_name(path.name + ".gz").write_bytes(packed)
        path.unlink()
        saved += len(raw) - len(packed)
    return saved


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def headless_pyplot():
    """matplotlib's pyplot on the Agg backend: the benchmarks draw files, never windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def light_png(png: bytes) -> bytes:
    """``png`` as a 256-colour palette PNG: a plot has few colours, so the picture stays the same to the eye (only
    anti-aliased edge pixels move to their nearest palette colour) at about a third of the bytes. Deterministic."""
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    opaque = image.mode == "RGB" or (image.mode == "RGBA" and image.getextrema()[3][0] == 255)
    if opaque:
        palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    else:
        palette = image.convert("RGBA").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save_figure(fig, path: Path, dpi: int = 80) -> Path:
    """Lay out, write (80 dpi by default, the size the docs embed; a PNG as a palette PNG, :func:`light_png`) and
    close a figure; returns its path."""
    fig.tight_layout()
    path = Path(path)
    if path.suffix.lower() == ".png":
        buffer = io.BytesIO()
        fig.savefig(buffer, dpi=dpi, format="png")
        path.write_bytes(light_png(buffer.getvalue()))
    else:
        fig.savefig(path, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def sandbox_conditions(load_before: list[float], load_after: list[float], isolation: str) -> dict[str, Any]:
    """The payload entries a sandbox benchmark opens with, the ones :func:`sandbox_run_conditions` reads: the machine,
    the load before and after, whether it ran as root, and bubblewrap's isolation."""
    return {
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "as_root": os.geteuid() == 0,
        "bwrap_isolation": isolation,
    }


def sandbox_run_conditions(payload: dict[str, Any], workers: int | None = None) -> list[str]:
    """The markdown lines the sandbox benchmarks open with: load before and after, cores, user, isolation."""
    worker_text = f"; {workers} workers" if workers is not None else ""
    return [
        (
            f"Load average (1, 5, 15 min) before: {payload['load_average_before']}, after: "
            f"{payload['load_average_after']}; {payload['machine']['logical_cores']} logical cores "
            f"({payload['machine']['cpu']}){worker_text}; running as "
            f"{'root' if payload['as_root'] else 'a regular user'}."
        ),
        "",
        f"bwrap: {payload['bwrap_isolation']}.",
    ]


def _compact_cli(argv: Sequence[str] | None = None) -> None:
    """``python -m benchmarks._common compact DIR...``: gzip every run file (``runs/*.json``, ``rl_runs/*.json``) and
    every ``start_eval.json`` under each DIR, as committed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks._common", description=_compact_cli.__doc__)
    parser.add_argument("command", choices=["compact"])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    paths = [p for d in args.dirs for pattern in COMPACTED for p in sorted(d.glob(pattern))]
    print(f"{len(paths)} files, {compact_json_files(paths) / 1e6:.1f} MB saved")


# What `compact` gzips: the per-run caches and the starts' evaluations, never a report or a model's own files.
COMPACTED = ("**/runs/*.json", "**/rl_runs/*.json", "**/start_eval.json")


if __name__ == "__main__":
    _compact_cli()
