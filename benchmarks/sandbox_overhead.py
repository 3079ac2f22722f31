"""Start-up cost of the code sandbox per program: bubblewrap (now) against the launcher it replaced.

    python -m benchmarks.sandbox_overhead                    # 40 runs of each, interleaved
    python -m benchmarks.sandbox_overhead --runs 100 --baseline-ref <commit>

A trivial program (``print(int(input()) + 1)`` on one stdin test) goes through ``Sandbox.run`` of each variant in turn,
so they share the machine's load; the figure is the median wall time per program, start to report. Variants:

* ``bwrap``: the current sandbox (bubblewrap: namespaces, uid drop, read-only binds, tmpfs workdir).
* ``previous``: the sandbox before bubblewrap (``unshare`` network+PID namespaces, rlimits, audit hook), loaded from
  git (``--baseline-ref``, default: the parent of the commit that removed its ``unshare`` launcher) into a temporary
  module; skipped with the reason recorded when git or that commit is unavailable (e.g. a shallow clone).
* ``none``: the current runner without OS isolation (``isolation="none"``), the floor both are measured against.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info, write_results
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits

REPO = Path(__file__).resolve().parent.parent
PROGRAM = "print(int(input()) + 1)"
OLD_FILES = ("riskpo_trl/code/sandbox.py", "riskpo_trl/code/_harness.py")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def default_baseline_ref() -> str:
    """The parent of the newest commit that changed the previous launcher's ``_unshare_prefix`` (its removal)."""
    removal = _git("log", "-1", "--format=%H", "-G_unshare_prefix", "--", OLD_FILES[0])
    if not removal:
        raise RuntimeError("no commit in this clone touches the previous launcher")
    return f"{removal}^"


def load_previous_sandbox(ref: str, directory: Path):
    """The sandbox module as of ``ref``, written with its runner into ``directory`` and imported from there."""
    for path in OLD_FILES:
        (directory / Path(path).name).write_text(_git("show", f"{ref}:{path}") + "\n")
    spec = importlib.util.spec_from_file_location("riskpo_previous_sandbox", directory / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def time_runs(sandboxes: dict[str, Any], runs: int, warmup: int) -> dict[str, list[float]]:
    """Wall seconds per ``Sandbox.run`` of the trivial program, variants interleaved run by run."""
    for sandbox in sandboxes.values():
        for _ in range(warmup):
            sandbox.run(PROGRAM, ["41\n"])
    times: dict[str, list[float]] = {name: [] for name in sandboxes}
    for _ in range(runs):
        for name, sandbox in sandboxes.items():
            start = time.perf_counter()
            result = sandbox.run(PROGRAM, ["41\n"])
            times[name].append(time.perf_counter() - start)
            if not (result.ok and result.outputs == ["42\n"]):
                raise RuntimeError(f"{name} sandbox failed the trivial program: {result}")
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baseline-ref", default=None, help="git ref of the previous sandbox ('none' to skip)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    limits = SandboxLimits(test_timeout_s=10, total_timeout_s=30)
    sandboxes: dict[str, Any] = {"bwrap": Sandbox(limits, max_workers=1)}
    sandboxes["bwrap"].check()
    baseline: dict[str, Any] = {"ref": args.baseline_ref}
    with tempfile.TemporaryDirectory() as directory:
        if args.baseline_ref != "none":
            try:
                ref = args.baseline_ref or default_baseline_ref()
                baseline = {"ref": ref, "commit": _git("rev-parse", ref)}
                previous = load_previous_sandbox(ref, Path(directory))
                sandboxes["previous"] = previous.Sandbox(previous.SandboxLimits(test_timeout_s=10, total_timeout_s=30),
                                                         max_workers=1)
                baseline["isolation"] = previous.detect_isolation().describe()
            except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
                baseline["unavailable"] = f"{type(exc).__name__}: {exc}".strip()[:300]
        sandboxes["none"] = Sandbox(limits, max_workers=1, isolation="none")
        load_before = [round(x, 2) for x in os.getloadavg()]
        times = time_runs(sandboxes, args.runs, args.warmup)
        load_after = [round(x, 2) for x in os.getloadavg()]

    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    payload = {
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "runs": args.runs,
        "warmup": args.warmup,
        "program": PROGRAM,
        "as_root": os.geteuid() == 0,
        "bwrap_isolation": sandboxes["bwrap"].isolation.describe(),
        "baseline": baseline,
        "median_ms": {name: round(value, 1) for name, value in medians.items()},
        "p10_p90_ms": {name: [round(statistics.quantiles(v, n=10)[0] * 1e3, 1),
                              round(statistics.quantiles(v, n=10)[-1] * 1e3, 1)] for name, v in times.items()
                       if len(v) >= 2},
    }
    lines = [
        f"# Code sandbox start-up per program (median of {args.runs} interleaved runs after {args.warmup} warm-up)",
        "",
        f"Load average (1, 5, 15 min) before: {load_before}, after: {load_after}; "
        f"{payload['machine']['logical_cores']} logical cores ({payload['machine']['cpu']}); "
        f"running as {'root' if payload['as_root'] else 'a regular user'}.",
        "",
        "| sandbox | median per program | p10 - p90 |",
        "|---|---:|---:|",
    ]
    for name, value in medians.items():
        low, high = payload["p10_p90_ms"].get(name, [value, value])
        lines.append(f"| {name} | {value:.1f} ms | {low:.1f} - {high:.1f} ms |")
    lines += ["", f"bwrap adds {medians['bwrap'] - medians['none']:+.1f} ms per program to the same runner without "
                  "OS isolation (`none`)."]
    if "previous" in medians:
        lines += [f"Against the previous sandbox ({baseline['commit'][:10]}: {baseline['isolation']}): "
                  f"{medians['bwrap'] - medians['previous']:+.1f} ms per program. The previous one started the "
                  "interpreter with `-I -B` (site-packages and their `.pth` hooks imported), the current variants with "
                  "`-I -S -B`: part of the difference is that, not the isolation."]
    elif "unavailable" in baseline:
        lines += ["", f"Previous sandbox not measured: {baseline['unavailable']}"]
    markdown = "\n".join(lines)
    write_results("sandbox_overhead", payload, markdown, args.out)
    print(markdown)
    return payload


if __name__ == "__main__":
    main()
