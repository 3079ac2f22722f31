"""Cost of the code sandbox per program: bubblewrap (now), without its seccomp filter, an earlier sandbox, no isolation.

    python -m benchmarks.sandbox_overhead                    # 40 runs of each, interleaved
    python -m benchmarks.sandbox_overhead --runs 100 --baseline-ref <commit>

Two programs go through ``Sandbox.run`` of each variant in turn, run by run, so the variants share the machine's
load; the figure is the median wall time per program, start to report:

* ``trivial``: ``print(int(input()) + 1)`` on one stdin test: the start-up cost per program;
* ``syscalls``: a loop of ``os.getppid()`` (``--syscalls`` calls): what the seccomp filter adds per system call.

Variants:

* ``bwrap``: the current sandbox (bubblewrap: namespaces, uid drop, seccomp filter, read-only binds, tmpfs workdir,
  and the per-run memory/pids cgroups where this process can make them).
* ``bwrap_no_seccomp``: the same without the seccomp filter (``Sandbox(seccomp=False)``).
* ``previous``: the sandbox of an earlier commit (``--baseline-ref``; default: the parent of the commit that removed
  the ``unshare`` launcher bubblewrap replaced), its ``riskpo_trl/code`` package loaded from git into a temporary
  package; skipped with the reason recorded when git or that commit is unavailable (e.g. a shallow clone).
* ``none``: the current runner without OS isolation (``isolation="none"``), the floor all are measured against.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine_info, sandbox_run_conditions, write_results
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits

REPO = Path(__file__).resolve().parent.parent
CODE_DIR = "riskpo_trl/code"
PREVIOUS_PACKAGE = "riskpo_previous_code"


def programs(syscalls: int) -> dict[str, tuple[str, str, str]]:
    """name -> (program, stdin, expected stdout)."""
    return {
        "trivial": ("print(int(input()) + 1)", "41\n", "42\n"),
        "syscalls": (f"import os\nfor _ in range({syscalls}):\n    os.getppid()\nprint(1)", "", "1\n"),
    }


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def default_baseline_ref() -> str:
    """The parent of the newest commit that changed the unshare launcher's ``_unshare_prefix`` (its removal)."""
    removal = _git("log", "-1", "--format=%H", "-G_unshare_prefix", "--", f"{CODE_DIR}/sandbox.py")
    if not removal:
        raise RuntimeError("no commit in this clone touches the unshare launcher")
    return f"{removal}^"


def load_previous_sandbox(ref: str, directory: Path):
    """The sandbox module of ``ref``: its ``riskpo_trl/code`` files written into ``directory`` as a package of their
    own (with an empty ``__init__``, so only what ``sandbox.py`` imports is loaded) and imported from there."""
    package = directory / PREVIOUS_PACKAGE
    package.mkdir()
    for name in _git("ls-tree", "--name-only", f"{ref}:{CODE_DIR}").splitlines():
        if name.endswith(".py") and name != "__init__.py":
            (package / name).write_text(_git("show", f"{ref}:{CODE_DIR}/{name}") + "\n")
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(f"{PREVIOUS_PACKAGE}.sandbox")
    finally:
        sys.path.remove(str(directory))


def time_runs(
    sandboxes: dict[str, Any], program: tuple[str, str, str], runs: int, warmup: int
) -> dict[str, list[float]]:
    """Wall seconds per ``Sandbox.run`` of ``program``, variants interleaved run by run."""
    source, stdin, expected = program
    for sandbox in sandboxes.values():
        for _ in range(warmup):
            sandbox.run(source, [stdin])
    times: dict[str, list[float]] = {name: [] for name in sandboxes}
    for _ in range(runs):
        for name, sandbox in sandboxes.items():
            start = time.perf_counter()
            result = sandbox.run(source, [stdin])
            times[name].append(time.perf_counter() - start)
            if not (result.ok and result.outputs == [expected]):
                raise RuntimeError(f"{name} sandbox failed the program {source[:40]!r}: {result}")
    return times


def _previous(ref: str | None, directory: Path, limits: dict[str, float]) -> tuple[Any | None, dict[str, Any]]:
    baseline: dict[str, Any] = {"ref": ref}
    try:
        ref = ref or default_baseline_ref()
        baseline = {"ref": ref, "commit": _git("rev-parse", ref)}
        previous = load_previous_sandbox(ref, directory)
        sandbox = previous.Sandbox(previous.SandboxLimits(**limits), max_workers=1)
        baseline["isolation"] = previous.detect_isolation().describe()
        return sandbox, baseline
    except (OSError, RuntimeError, ImportError, subprocess.CalledProcessError) as exc:
        baseline["unavailable"] = f"{type(exc).__name__}: {exc}".strip()[:300]
        return None, baseline


def _quantiles(values: list[float]) -> list[float]:
    deciles = statistics.quantiles(values, n=10)
    return [round(deciles[0] * 1e3, 1), round(deciles[-1] * 1e3, 1)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--syscalls", type=int, default=200_000, help="os.getppid() calls of the syscall program")
    parser.add_argument("--baseline-ref", default=None, help="git ref of an earlier sandbox ('none' to skip)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    limits = {"test_timeout_s": 10, "total_timeout_s": 30}
    sandboxes: dict[str, Any] = {
        "bwrap": Sandbox(SandboxLimits(**limits), max_workers=1),
        "bwrap_no_seccomp": Sandbox(SandboxLimits(**limits), max_workers=1, seccomp=False),
    }
    sandboxes["bwrap"].check()
    baseline: dict[str, Any] = {"ref": "none"}
    with tempfile.TemporaryDirectory() as directory:
        if args.baseline_ref != "none":
            previous, baseline = _previous(args.baseline_ref, Path(directory), limits)
            if previous is not None:
                sandboxes["previous"] = previous
        sandboxes["none"] = Sandbox(SandboxLimits(**limits), max_workers=1, isolation="none")
        load_before = [round(x, 2) for x in os.getloadavg()]
        times = {
            name: time_runs(sandboxes, program, args.runs, args.warmup)
            for name, program in programs(args.syscalls).items()
        }
        load_after = [round(x, 2) for x in os.getloadavg()]

    medians = {
        program: {name: statistics.median(values) * 1e3 for name, values in by_variant.items()}
        for program, by_variant in times.items()
    }
    seccomp_ns = (medians["syscalls"]["bwrap"] - medians["syscalls"]["bwrap_no_seccomp"]) * 1e6 / args.syscalls
    payload = {
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "runs": args.runs,
        "warmup": args.warmup,
        "programs": programs(args.syscalls),
        "as_root": os.geteuid() == 0,
        "bwrap_isolation": sandboxes["bwrap"].isolation.describe(),
        "baseline": baseline,
        "median_ms": {
            program: {name: round(value, 1) for name, value in by_variant.items()}
            for program, by_variant in medians.items()
        },
        "p10_p90_ms": {
            program: {name: _quantiles(values) for name, values in by_variant.items() if len(values) >= 2}
            for program, by_variant in times.items()
        },
        "seccomp_ns_per_syscall": round(seccomp_ns, 1),
    }
    markdown = _markdown(payload, args)
    write_results("sandbox_overhead", payload, markdown, args.out)
    print(markdown)
    return payload


def _markdown(payload: dict[str, Any], args: argparse.Namespace) -> str:
    medians, spreads = payload["median_ms"], payload["p10_p90_ms"]
    lines = [
        f"# Code sandbox cost per program (median of {args.runs} interleaved runs after {args.warmup} warm-up)",
        "",
        *sandbox_run_conditions(payload),
        "",
        f"| sandbox | trivial program | p10 - p90 | {args.syscalls:,} getppid() calls | p10 - p90 |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, value in medians["trivial"].items():
        trivial = spreads["trivial"].get(name, [value, value])
        syscalls = spreads["syscalls"].get(name, [medians["syscalls"][name]] * 2)
        lines.append(
            f"| {name} | {value:.1f} ms | {trivial[0]:.1f} - {trivial[1]:.1f} ms | "
            f"{medians['syscalls'][name]:.1f} ms | {syscalls[0]:.1f} - {syscalls[1]:.1f} ms |"
        )
    trivial = medians["trivial"]
    lines += [
        "",
        (
            f"bwrap adds {trivial['bwrap'] - trivial['none']:+.1f} ms per program to the same runner without "
            f"OS isolation (`none`); the seccomp filter {trivial['bwrap'] - trivial['bwrap_no_seccomp']:+.1f} ms "
            f"to start-up and {payload['seccomp_ns_per_syscall']:+.0f} ns per system call (differences of "
            "medians: compare them with the p10 - p90 spreads)."
        ),
    ]
    baseline = payload["baseline"]
    if "previous" in trivial:
        lines += [
            "",
            (
                f"Against the sandbox of {baseline['commit'][:10]} ({baseline['isolation']}): "
                f"{trivial['bwrap'] - trivial['previous']:+.1f} ms per program."
            ),
        ]
    elif "unavailable" in baseline:
        lines += ["", f"Earlier sandbox not measured: {baseline['unavailable']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
