"""Throughput of the code reward on a batch: bubblewrap against no OS isolation, side by side.

    python -m benchmarks.sandbox_throughput                  # 5 rounds of a 64-completion batch per variant
    python -m benchmarks.sandbox_throughput --rounds 9 --completions 64 --tests 10

One batch is ``--completions`` completions of a stdin problem with ``--tests`` tests, half of them correct (``a + b``)
and half wrong (``a - b``: they fail at their first test, as a real batch's wrong programs often do). Each round scores
the batch once with every variant in turn, so the variants share the machine's load; the figure is programs per
second, the median over rounds, and the ratio of the medians (also the median of the per-round ratios).

Variants, all with ``max_workers`` = `default_max_workers()` and the same limits:

* ``bwrap``: `CodeReward` as shipped: bubblewrap sandbox, then a judge process per completion.
* ``none``: the same `CodeReward` with ``isolation="none"`` (the same runner and judge, no OS isolation).
* ``bwrap_in_process`` and ``none_in_process``: the same sandboxes with the report judged in the benchmark's own
  interpreter (`Sandbox.run` then `TestSpec.passes`, as the reward did before judges were separate processes), for
  comparison only: what the judge processes cost, and the isolated/unisolated ratio of that earlier design measured
  under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._common import sandbox_conditions, sandbox_run_conditions, write_results
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits, default_max_workers
from riskpo_trl.code.testspec import TestSpec

CORRECT = "a, b = map(int, input().split())\nprint(a + b)"
WRONG = "a, b = map(int, input().split())\nprint(a - b)"


def batch(completions: int, tests: int) -> tuple[list[list[dict]], list[str], list[float]]:
    """(completions, tests column, expected scores) of one batch."""
    spec = TestSpec("stdin", [f"{i} {i + 1}\n" for i in range(tests)], [f"{2 * i + 1}\n" for i in range(tests)])
    programs = [CORRECT if i % 2 == 0 else WRONG for i in range(completions)]
    texts = [[{"role": "assistant", "content": f"```python\n{program}\n```"}] for program in programs]
    return texts, [spec.to_json()] * completions, [1.0 if p == CORRECT else 0.0 for p in programs]


class InProcessJudging:
    """The bubblewrap sandbox with the report parsed and compared in this interpreter (the earlier design)."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self.pool = ThreadPoolExecutor(max_workers=sandbox.max_workers)

    def score(self, completion, tests: str) -> float:
        spec = TestSpec.from_json(tests)
        program = completion[0]["content"].split("```python\n", 1)[1].rsplit("```", 1)[0]
        result = self.sandbox.run(
            program, spec.sandbox_inputs(), spec.style, spec.fn_name, output_caps=spec.output_caps()
        )
        return float(result.ok and spec.passes(result.outputs))

    def __call__(self, completions, tests) -> list[float]:
        return list(self.pool.map(self.score, completions, tests))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--workers", type=int, default=None, help="default: default_max_workers()")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    workers = args.workers or default_max_workers()
    limits = SandboxLimits(test_timeout_s=10, total_timeout_s=30)
    variants = {
        "bwrap": CodeReward(sandbox=Sandbox(limits, max_workers=workers)),
        "none": CodeReward(sandbox=Sandbox(limits, max_workers=workers, isolation="none")),
        "bwrap_in_process": InProcessJudging(Sandbox(limits, max_workers=workers)),
        "none_in_process": InProcessJudging(Sandbox(limits, max_workers=workers, isolation="none")),
    }
    isolation = variants["bwrap"].sandbox.check().describe()
    completions, tests, expected = batch(args.completions, args.tests)
    for reward in variants.values():  # warm-up: probes, judge server, page cache
        reward(completions[:4], tests[:4])
    load_before = [round(x, 2) for x in os.getloadavg()]
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, reward in variants.items():
            start = time.perf_counter()
            scores = reward(completions, tests)
            seconds[name].append(time.perf_counter() - start)
            if scores != expected:
                raise RuntimeError(f"{name} scored the batch wrongly: {scores}")
    load_after = [round(x, 2) for x in os.getloadavg()]

    rate = {name: [args.completions / s for s in values] for name, values in seconds.items()}
    median = {name: statistics.median(values) for name, values in rate.items()}
    paired = [b / n for b, n in zip(rate["bwrap"], rate["none"])]
    paired_in_process = [b / n for b, n in zip(rate["bwrap_in_process"], rate["none_in_process"])]
    payload = {
        **sandbox_conditions(load_before, load_after, isolation),
        "rounds": args.rounds,
        "completions": args.completions,
        "tests_per_completion": args.tests,
        "max_workers": workers,
        "programs_per_s": {name: [round(r, 2) for r in values] for name, values in rate.items()},
        "median_programs_per_s": {name: round(value, 2) for name, value in median.items()},
        "bwrap_over_none_ratio_of_medians": round(median["bwrap"] / median["none"], 3),
        "bwrap_over_none_median_paired_ratio": round(statistics.median(paired), 3),
        "in_process_bwrap_over_none_ratio_of_medians": round(
            median["bwrap_in_process"] / median["none_in_process"], 3
        ),
        "in_process_bwrap_over_none_median_paired_ratio": round(statistics.median(paired_in_process), 3),
        "judge_process_over_in_process": round(median["bwrap"] / median["bwrap_in_process"], 3),
    }
    markdown = _markdown(payload)
    write_results("sandbox_throughput", payload, markdown, args.out)
    print(markdown)
    return payload


def _markdown(payload: dict[str, Any]) -> str:
    lines = [
        (
            f"# Code reward throughput: {payload['completions']} completions x {payload['tests_per_completion']} stdin "
            f"tests, half correct (median of {payload['rounds']} interleaved rounds)"
        ),
        "",
        *sandbox_run_conditions(payload, payload["max_workers"]),
        "",
        "| variant | programs/s (median) | per round |",
        "|---|---:|---|",
    ]
    for name, value in payload["median_programs_per_s"].items():
        rounds = ", ".join(f"{r:.1f}" for r in payload["programs_per_s"][name])
        lines.append(f"| {name} | {value:.2f} | {rounds} |")
    lines += [
        "",
        (
            f"bwrap / none: {payload['bwrap_over_none_ratio_of_medians']:.3f} (ratio of medians), "
            f"{payload['bwrap_over_none_median_paired_ratio']:.3f} (median of per-round ratios). "
            "Judged in-process (the earlier design), bwrap / none: "
            f"{payload['in_process_bwrap_over_none_ratio_of_medians']:.3f} (ratio of medians), "
            f"{payload['in_process_bwrap_over_none_median_paired_ratio']:.3f} (paired). "
            f"Judge processes / judging in-process, both under bwrap: "
            f"{payload['judge_process_over_in_process']:.3f}."
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
