"""Where an isolated run's time goes: each step of the bubblewrap path timed, next to the same run without isolation.

    python -m benchmarks.sandbox_steps                 # 60 runs per variant, one at a time
    python -m benchmarks.sandbox_steps --runs 100

One run is one completion of the throughput benchmark's stdin problem (`benchmarks.sandbox_throughput`: ``a + b``,
10 tests, all passing), started through `Sandbox.run` one after another with one worker, alternating between
``isolation="none"`` and bubblewrap run by run so both share the machine's load. Reported per run, as medians:

* wall time of the whole run, and CPU time (this process plus its children, so the sandbox's processes; kernel work
  done on their behalf by kernel threads is not included);
* for bubblewrap, the wall time of each step: taking the worker slot's sandbox, made ready ahead of the run
  (`riskpo_trl.code.ahead`); the steps that made it ready in the background while the slot's previous run went on,
  marked "(ahead)": mounting the working directory (root only), taking the run's cgroups, starting bwrap held on
  its option pipe and moving it into them; then releasing bwrap, reading its PID 1, the run itself (bwrap's
  namespaces, the interpreter and the tests), the kill, and giving back the cgroups and the working directory.

A step that waits rather than computes (moving a process into a cgroup waits for the kernel when no other migration
happened just before) shows as wall time without CPU time. With as many workers as cores, a batch is bound by CPU
time, plus the waits that no other work fills: the throughput benchmark measures that.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import time
from collections import defaultdict
from typing import Any

from benchmarks._common import sandbox_conditions, sandbox_run_conditions, write_results
from benchmarks.sandbox_throughput import CORRECT
from riskpo_trl.code import ahead, bwrap, cgroups, sandbox
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits

# (owner, attribute, label) of each timed step, in the order a run takes them
STEPS = [
    (ahead.ReadyAhead, "take", "wait for the slot's ready sandbox"),
    (bwrap.BwrapLauncher, "mount_workdir", "(ahead) mount the working directory"),
    (cgroups.CgroupSupport, "acquire", "(ahead) take the run's cgroups (reused once empty)"),
    (cgroups.RunCgroup, "add", "(ahead) move bwrap into them"),
    (sandbox._BwrapStart, "__init__", "(ahead) start bwrap, held (includes the move)"),
    (sandbox._BwrapStart, "release", "release bwrap (write its options)"),
    (sandbox, "_namespace_init", "read bwrap's PID 1"),
    (sandbox.Sandbox, "_collect", "the run: namespaces, interpreter, tests"),
    (sandbox, "_kill_bwrap", "kill and reap"),
    (cgroups.CgroupSupport, "release", "give the cgroups back (emptiness checked)"),
    (bwrap.BwrapLauncher, "unmount_workdir", "unmount the working directory"),
]


def _timed(function, label: str, times: dict[str, list[float]]):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            times[label].append(time.perf_counter() - start)

    return wrapper


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    steps: dict[str, list[float]] = defaultdict(list)
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in STEPS]
    limits = SandboxLimits(test_timeout_s=10, total_timeout_s=30)
    variants = {"none": Sandbox(limits, max_workers=1, isolation="none"), "bwrap": Sandbox(limits, max_workers=1)}
    isolation = variants["bwrap"].check().describe()
    inputs = [f"{i} {i + 1}\n" for i in range(args.tests)]
    expected = [f"{2 * i + 1}\n" for i in range(args.tests)]
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for owner, name, label in STEPS:
            setattr(owner, name, _timed(getattr(owner, name), label, steps))
        for box in variants.values():  # warm-up: probes, staging namespace, page cache
            box.run(CORRECT, inputs)
        steps.clear()
        load_before = [round(x, 2) for x in os.getloadavg()]
        for _ in range(args.runs):
            for name, box in variants.items():
                cpu_start, start = _cpu_seconds(), time.perf_counter()
                result = box.run(CORRECT, inputs)
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(_cpu_seconds() - cpu_start)
                if result.outputs != expected:
                    raise RuntimeError(f"{name} ran the program wrongly: {result}")
        load_after = [round(x, 2) for x in os.getloadavg()]
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)

    def ms(values: list[float]) -> float:
        return round(1000 * statistics.median(values), 2)

    payload = {
        **sandbox_conditions(load_before, load_after, isolation),
        "runs": args.runs,
        "tests_per_run": args.tests,
        "median_wall_ms": {name: ms(values) for name, values in wall.items()},
        "median_cpu_ms": {name: ms(values) for name, values in cpu.items()},
        "bwrap_step_median_wall_ms": {label: ms(steps[label]) for _, _, label in STEPS if steps.get(label)},
    }
    payload["latency_ratio_none_over_bwrap"] = round(
        payload["median_wall_ms"]["none"] / payload["median_wall_ms"]["bwrap"], 3
    )
    payload["cpu_ratio_none_over_bwrap"] = round(
        payload["median_cpu_ms"]["none"] / payload["median_cpu_ms"]["bwrap"], 3
    )
    markdown = _markdown(payload)
    write_results("sandbox_steps", payload, markdown, args.out)
    print(markdown)
    return payload


def _markdown(payload: dict[str, Any]) -> str:
    lines = [
        (
            f"# Code sandbox: where one run's time goes (median of {payload['runs']} runs per variant, one worker, "
            f"{payload['tests_per_run']} stdin tests)"
        ),
        "",
        *sandbox_run_conditions(payload),
        "",
        "| variant | wall ms | CPU ms (this process and its children) |",
        "|---|---:|---:|",
    ]
    for name in payload["median_wall_ms"]:
        lines.append(f"| {name} | {payload['median_wall_ms'][name]} | {payload['median_cpu_ms'][name]} |")
    lines += ["", "| bubblewrap step | wall ms |", "|---|---:|"]
    lines += [f"| {label} | {value} |" for label, value in payload["bwrap_step_median_wall_ms"].items()]
    lines += [
        "",
        (
            f"none / bwrap: {payload['latency_ratio_none_over_bwrap']} in wall time per run, "
            f"{payload['cpu_ratio_none_over_bwrap']} in CPU time per run (the ceiling of the throughput ratio "
            "when every core is busy)."
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
