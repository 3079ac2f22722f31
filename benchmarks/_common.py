"""Small helpers shared by the benchmarks: machine description, result files, mean and std, headless figures."""

from __future__ import annotations

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


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_mean_std(values: Sequence[float], digits: int = 3) -> str:
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def headless_pyplot():
    """matplotlib's pyplot on the Agg backend: the benchmarks draw files, never windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out, write (80 dpi, the size the docs embed) and close a figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def sandbox_run_conditions(payload: dict[str, Any], workers: int | None = None) -> list[str]:
    """The markdown lines the sandbox benchmarks open with: load before and after, cores, user, isolation."""
    worker_text = f"; {workers} workers" if workers is not None else ""
    return [
        (f"Load average (1, 5, 15 min) before: {payload['load_average_before']}, after: "
         f"{payload['load_average_after']}; {payload['machine']['logical_cores']} logical cores "
         f"({payload['machine']['cpu']}){worker_text}; running as "
         f"{'root' if payload['as_root'] else 'a regular user'}."),
        "",
        f"bwrap: {payload['bwrap_isolation']}.",
    ]

