"""A default torch thread count for CPU runs, shared by ``riskpo-train`` and ``riskpo-eval`` (a leaf module).

torch starts one thread per core whatever else runs on the machine. With several processes per machine, or cores
already busy, its threads wait on each other: on a loaded 2-core machine, torch's default made a tiny training run
8 times slower than ``OMP_NUM_THREADS=1`` (7.56 s against 0.97 s). So when nothing chose a count (no
``OMP_NUM_THREADS``), a CPU run uses at most the cores that are idle, shared between the processes of this machine.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a job scheduler may restrict)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def suggested_threads(current: int, cores: int, load_average: float, local_processes: int) -> int:
    """At most ``current`` (torch's own choice), no more than this process's share of the cores, and no more than
    the cores the one-minute load average leaves idle; at least 1."""
    idle = cores - round(load_average)
    return max(1, min(current, cores // max(local_processes, 1), idle))


def use_default_cpu_threads(use_cpu: bool = False) -> int | None:
    """On a CPU run (``use_cpu``, or no accelerator visible) with ``OMP_NUM_THREADS`` unset, lower torch's thread
    count to :func:`suggested_threads` and say so in one log line. Returns the count it uses, or None when it left
    torch alone (an accelerator, or a count the user chose)."""
    if "OMP_NUM_THREADS" in os.environ or not running_on_cpu(use_cpu):
        return None
    import torch

    current = torch.get_num_threads()
    cores = usable_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = suggested_threads(current, cores, load, processes)
    if threads < current:
        torch.set_num_threads(threads)
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one line per machine
        logger.warning(
            f"CPU run: {threads} torch thread(s) ({cores} usable core(s), load average {load:.1f}, "
            f"{processes} process(es) on this machine). Set OMP_NUM_THREADS to choose the count yourself."
        )
    return threads


def running_on_cpu(use_cpu: bool = False) -> bool:
    """Whether torch computes on the CPU here: asked for (``use_cpu``), or no CUDA, XPU or MPS device is visible."""
    import torch

    if use_cpu:
        return True
    accelerators = (
        torch.cuda.is_available(),
        hasattr(torch, "xpu") and torch.xpu.is_available(),
        torch.backends.mps.is_available(),
    )
    return not any(accelerators)
