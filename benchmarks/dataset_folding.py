"""What folding one dataset check cell costs the trainer, at the edges of its budget.

    python -m benchmarks.dataset_folding              # 5 runs per cell
    python -m benchmarks.dataset_folding --runs 9

Each run is a fresh process that imports the code layer, then has 4 threads (a code reward's ``max_workers``) ask
for the same cell at once (`riskpo_trl.code.assertions.instrument_assertions`), as the reward's workers do when the
completions of one prompt are scored. It reports the process's CPU time (all threads, user and system) and the growth
of its peak resident memory (``VmHWM``) over the imports and the cell's text, and whether the cell was folded or refused. Reported:
the median and the largest over the runs. The cells: the red team's nested loops, loops and bodies sized to reach
each limit (statements after unrolling, nodes parsed and built, elements the evaluator touches, the length of the
code), and honest checks as large as the caps let through.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info, write_results

ROOT = Path(__file__).resolve().parents[1]


def _cells() -> dict[str, str]:
    numbers = ",".join(map(str, range(5000)))
    table = ", ".join(f"(({i}, {i + 1}), {2 * i + 1})" for i in range(2000))
    return {
        "red team: 600 x 600 loops of pass": "for i in range(600):\n    for j in range(600):\n        pass\n"
        "assert f(1) == 2\n",
        "loops just over the statement cap": "for i in range(1500):\n    if i % 2 == 1:\n        for j in range(30):\n"
        "            k = j\nassert f(1) == 2\n",
        "a 5,000-node body 2,000 times": f"for i in range(2000):\n    x = [{numbers}]\nassert f(1) == 2\n",
        "a 100,000-element row 2,000 times": "for x in [list(range(100000))] * 2000:\n    assert f(x[0]) == 1\n",
        "evaluator: sorted 1M-element lists": "n = "
        + " + ".join(["len(sorted(list(range(1000000))))"] * 30)
        + "\nassert f(1) == n\n",
        "130,000 parsed nodes (a literal)": "assert f([" + ",".join(map(str, range(130_000))) + "]) == 5\n",
        "over the length cap (1 MB)": "assert f(1) == 2\n" + "#" * 1_000_000,
        "honest: a 2,000-row loop table": f"tests = [{table}]\nfor t in tests:\n    assert f(*t[0]) == t[1]\n",
        "honest: 5,000 assertions": "\n".join(f"assert f({i}, {i + 1}) == {2 * i + 1}" for i in range(5000)),
    }


PROBE = """
import json, resource, sys, threading
sys.path.insert(0, sys.argv[1])
from riskpo_trl.code.assertions import instrument_assertions
def peak_mb():  # this process's own high-water mark (ru_maxrss would carry the benchmark's over from before exec)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024

cell = sys.stdin.read()
peak_before = peak_mb()
before = resource.getrusage(resource.RUSAGE_SELF)
outcomes, barrier = [], threading.Barrier(4)

def ask():
    barrier.wait()
    try:
        outcomes.append("folded: %d probes" % len(instrument_assertions(cell).probes))
    except ValueError as exc:
        outcomes.append("refused: " + str(exc)[:110])

threads = [threading.Thread(target=ask) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                  "peak_growth_mb": peak_mb() - peak_before, "outcome": outcomes[0],
                  "computations": instrument_assertions.cache_info().misses}))
"""


def measure(cell: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT)], input=cell, capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cells", nargs="*", help="only these cells (by name)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cells = {name: code for name, code in _cells().items() if not args.cells or name in args.cells}
    payload: dict[str, Any] = {"machine": machine_info(), "runs": args.runs, "threads": 4, "cells": {}}
    for name, code in cells.items():
        runs = [measure(code) for _ in range(args.runs)]
        payload["cells"][name] = {
            "outcome": runs[0]["outcome"],
            "computations": max(run["computations"] for run in runs),
            "cpu_s_median": round(statistics.median(run["cpu_s"] for run in runs), 3),
            "cpu_s_max": round(max(run["cpu_s"] for run in runs), 3),
            "peak_growth_mb_median": round(statistics.median(run["peak_growth_mb"] for run in runs), 1),
            "peak_growth_mb_max": round(max(run["peak_growth_mb"] for run in runs), 1),
        }
    payload["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    markdown = _markdown(payload)
    write_results("dataset_folding", payload, markdown, args.out)
    print(markdown)
    return payload


def _markdown(payload: dict[str, Any]) -> str:
    machine = payload["machine"]
    lines = [
        "# Folding one dataset check cell: the trainer's cost",
        "",
        f"{machine['cpu']}, {machine['logical_cores']} cores, Python {machine['python']}; load "
        f"{machine.get('load_average_at_start')} at the start, {payload['load_average_at_end']} at the end. "
        f"{payload['runs']} fresh processes per cell, each with {payload['threads']} threads asking for the cell at "
        "once; CPU time of the whole process, peak resident memory over the imports.",
        "",
        "| cell | outcome | computed | CPU s median (max) | peak MB median (max) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, cell in payload["cells"].items():
        lines.append(
            f"| {name} | {cell['outcome']} | {cell['computations']} | {cell['cpu_s_median']} "
            f"({cell['cpu_s_max']}) | {cell['peak_growth_mb_median']} ({cell['peak_growth_mb_max']}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
