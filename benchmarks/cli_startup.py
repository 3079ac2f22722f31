"""How long each console script takes to answer ``--help`` (it must be under 1 s), how long ``riskpo-train`` takes to
refuse a misspelled option (checked before torch, transformers and TRL load) and to print ``--help-all`` (which loads
them), as a fresh process.

    python -m benchmarks.cli_startup [--runs 7]

Each command is started ``--runs`` times as ``python -c`` calling its entry point (what the installed console script
does); the table gives the median, min and max wall time, next to a bare ``python -c pass`` for the interpreter's own
start-up, and the load average before and after (timings on a loaded machine are slower). Results go to
benchmarks/results/cli_startup.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import RESULTS_DIR, write_results

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
# riskpo-train's other timed commands: (arguments, the exit code that means it answered as expected).
TRAIN_COMMANDS = {
    "riskpo-train --config TINY --bundel_size 2 (a typo: refused)": (
        ["--config", TINY_RECIPE, "--bundel_size", "2"],
        2,
    ),
    "riskpo-train --help-all": (["--help-all"], 0),
}


def console_scripts(pyproject: Path) -> dict[str, str]:
    """``[project.scripts]`` of ``pyproject.toml`` (name -> "module:function"); tomllib needs Python 3.11."""
    scripts, in_section = {}, False
    for line in pyproject.read_text().splitlines():
        if line.startswith("["):
            in_section = line.strip() == "[project.scripts]"
        elif in_section and "=" in line:
            name, target = line.split("=", 1)
            scripts[name.strip()] = target.strip().strip('"')
    return scripts


def entry_point_command(target: str, name: str, args: tuple[str, ...] = ("--help",)) -> list[str]:
    module, function = target.split(":")
    code = f"import sys; sys.argv = [{name!r}, *{list(args)!r}]; from {module} import {function}; {function}()"
    return [sys.executable, "-c", code]


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(command: list[str], runs: int, exit_code: int = 0) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of each run; the CPU time depends less on the machine's load."""
    times, cpu = [], []
    for _ in range(runs):
        start, cpu_start = time.perf_counter(), children_cpu_seconds()
        result = subprocess.run(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
        )
        times.append(time.perf_counter() - start)
        cpu.append(children_cpu_seconds() - cpu_start)
        if result.returncode != exit_code:
            raise SystemExit(f"{command} exited with {result.returncode}, not {exit_code}: {result.stderr[-2000:]}")
    return times, cpu


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    scripts = console_scripts(ROOT / "pyproject.toml")
    load_before = [round(x, 2) for x in os.getloadavg()]
    commands = {"python -c pass (interpreter only)": ([sys.executable, "-c", "pass"], 0)}
    commands |= {f"{name} --help": (entry_point_command(target, name), 0) for name, target in sorted(scripts.items())}
    commands |= {
        label: (entry_point_command(scripts["riskpo-train"], "riskpo-train", tuple(argv)), code)
        for label, (argv, code) in TRAIN_COMMANDS.items()
    }
    rows = []
    for label, (command, exit_code) in commands.items():
        times, cpu = time_command(command, args.runs, exit_code)
        rows.append(
            {
                "command": label,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "median_cpu_s": statistics.median(cpu),
                "runs": args.runs,
            }
        )
    load_after = [round(x, 2) for x in os.getloadavg()]

    lines = [
        (
            f"CPU cores: {os.cpu_count()}; load average (1, 5, 15 min) before: {load_before}, after: {load_after}; "
            f"niceness {os.nice(0)}"
        ),
        "",
        "| command | median (s) | min (s) | max (s) | median CPU (s) | runs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
        f"{r['median_cpu_s']:.3f} | {r['runs']} |"
        for r in rows
    ]
    markdown = "\n".join(lines)
    print(markdown)
    payload = {
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cpu_cores": os.cpu_count(),
        "niceness": os.nice(0),
        "python": sys.version.split()[0],
        "results": rows,
    }
    write_results("cli_startup", payload, markdown, Path(args.out))
    return payload


if __name__ == "__main__":
    main()
