"""How long each console script takes to answer ``--help`` (it must be under 1 s), how long ``riskpo-train`` takes to
refuse a misspelled option and each of a new user's common mistakes (a bundle that does not divide the batch, a
missing model path, data without a prompt column or with a wrong answer column, a busy or finished ``output_dir``:
all checked before torch, transformers and TRL load) and to print ``--help-all`` (from the generated option list;
with a recipe, from the full parser), as a fresh process.

    python -m benchmarks.cli_startup [--runs 7]

Each command is started ``--runs`` times as ``python -c`` calling its entry point (what the installed console script
does); the table gives the median, min and max wall time, next to a bare ``python -c pass`` for the interpreter's own
start-up, and the load average before and after (timings on a loaded machine are slower). Results go to
benchmarks/results/cli_startup.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks._common import RESULTS_DIR, write_results

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
# The mistakes' own files, made in a temporary folder FIXTURES stands for: rows with other column names, an
# output_dir whose lock a live process holds, one whose last checkpoint finished the recipe's 6 steps.
FIXTURES = "{fixtures}"
OWN_ROWS = ["--dataset_name", "json", "--dataset_files", f"{FIXTURES}/questions.jsonl"]
# riskpo-train's other timed commands: (arguments, the exit code that means it answered as expected).
TRAIN_COMMANDS = {
    "riskpo-train --config TINY --bundel_size 2 (a typo: refused)": (
        ["--config", TINY_RECIPE, "--bundel_size", "2"],
        2,
    ),
    "riskpo-train --config TINY --bundle_size 3 (2 prompts per batch: refused)": (
        ["--config", TINY_RECIPE, "--bundle_size", "3", "--output_dir", f"{FIXTURES}/new"],
        2,
    ),
    "riskpo-train --config TINY --model_name_or_path ./no-such-model (refused)": (
        ["--config", TINY_RECIPE, "--model_name_or_path", "./no-such-model", "--build_tiny_model", "false"],
        2,
    ),
    "riskpo-train --config TINY, rows without a prompt column (refused)": (
        ["--config", TINY_RECIPE, *OWN_ROWS, "--output_dir", f"{FIXTURES}/new"],
        2,
    ),
    "riskpo-train --config TINY, a wrong --answer_column (refused)": (
        ["--config", TINY_RECIPE, *OWN_ROWS, "--prompt_column", "question", "--answer_column", "answr"],
        2,
    ),
    "riskpo-train --config TINY into a busy output_dir (refused)": (
        ["--config", TINY_RECIPE, "--output_dir", f"{FIXTURES}/busy"],
        2,
    ),
    "riskpo-train --config TINY into a finished output_dir (nothing to train)": (
        ["--config", TINY_RECIPE, "--output_dir", f"{FIXTURES}/finished"],
        0,
    ),
    "riskpo-train --help-all": (["--help-all"], 0),
    "riskpo-train --help-all --config TINY (the recipe's defaults: loads TRL)": (
        ["--help-all", "--config", TINY_RECIPE],
        0,
    ),
}


@contextlib.contextmanager
def mistake_fixtures() -> Iterator[str]:
    """A temporary folder with the files the mistakes above use, and a process holding ``busy``'s lock."""
    with tempfile.TemporaryDirectory() as folder:
        rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
        Path(folder, "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        finished = Path(folder, "finished", "checkpoint-6")
        finished.mkdir(parents=True)
        (finished / "trainer_state.json").write_text(json.dumps({"global_step": 6, "max_steps": 6}))
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(Path(folder, "busy"))], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        try:
            holder.stdout.readline()  # "locked"
            yield folder
        finally:
            holder.kill()
            holder.wait()


HOLD_LOCK = (
    "import sys, time; from riskpo_trl.job.run_lock import acquire; acquire(sys.argv[1]); print('locked', "
    "flush=True); time.sleep(3600)"
)


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


def time_command(command: list[str], runs: int, exit_code: int = 0) -> tuple[list[float], list[float], str]:
    """(wall seconds, CPU seconds) of each run, and the last line the command printed; the CPU time depends less on
    the machine's load."""
    times, cpu = [], []
    for _ in range(runs):
        start, cpu_start = time.perf_counter(), children_cpu_seconds()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        cpu.append(children_cpu_seconds() - cpu_start)
        if result.returncode != exit_code:
            raise SystemExit(f"{command} exited with {result.returncode}, not {exit_code}: {result.stderr[-2000:]}")
    printed = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return times, cpu, printed[-1] if printed else ""


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)

    scripts = console_scripts(ROOT / "pyproject.toml")
    load_before = [round(x, 2) for x in os.getloadavg()]
    commands = {"python -c pass (interpreter only)": ([sys.executable, "-c", "pass"], 0)}
    commands |= {f"{name} --help": (entry_point_command(target, name), 0) for name, target in sorted(scripts.items())}
    rows = []
    with mistake_fixtures() as fixtures:
        commands |= {
            label: (
                entry_point_command(
                    scripts["riskpo-train"], "riskpo-train", tuple(a.format(fixtures=fixtures) for a in argv)
                ),
                code,
            )
            for label, (argv, code) in TRAIN_COMMANDS.items()
        }
        timings = {label: time_command(command, args.runs, code) for label, (command, code) in commands.items()}
        # The answers name the temporary folder: shown as FIXTURES, so the results name no path of this machine.
        timings = {
            label: (times, cpu, answer.replace(fixtures, "FIXTURES"))
            for label, (times, cpu, answer) in timings.items()
        }
    for label, (times, cpu, answer) in timings.items():
        rows.append(
            {
                "command": label,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "median_cpu_s": statistics.median(cpu),
                "runs": args.runs,
                "answer": answer,
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
    lines += ["", "What each refused or finished command printed last:", ""]
    lines += [
        f"- `{r['command']}`: {r['answer']}"
        for r in rows
        if r["command"] in TRAIN_COMMANDS and r["runs"] and "help" not in r["command"]
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
