"""Every committed study report is a function of its cached runs: ``--report-only`` on a copy of the study's folder,
its reports deleted, writes them again byte for byte.

Each study runs as its own process (the pipeline sets one torch thread and the quiet environment for the whole
process). The two slowest reports (tens of seconds on 2 busy cores) are marked slow.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# folder -> (module, options besides --report-only and --out, the report files it writes)
STUDIES = {
    "lm": (
        "benchmarks.lm_study.short_protocol",
        [],
        ["lm_study", "lm_training_curves.png", "lm_pass_at_k_by_difficulty.png"],
    ),
    "lm_extended": (
        "benchmarks.lm_study.short_protocol",
        [],
        ["lm_study", "lm_training_curves.png", "lm_pass_at_k_by_difficulty.png"],
    ),
    "lm_long": (
        "benchmarks.lm_study.long_protocol",
        [],
        ["lm_long", "lm_long_entropy.png", "lm_long_pass_at_k.png", "lm_long_trajectories.png"],
    ),
    "lm_frontier": (
        "benchmarks.lm_study.frontier_protocol",
        ["--reference", RESULTS / "lm_exact"],
        ["lm_frontier", "lm_frontier.png"],
    ),
    "lm_exact": ("benchmarks.lm_study.exact_protocol", [], ["lm_exact", "lm_exact_pass_at_k.png"]),
    "lm_baseline": (
        "benchmarks.lm_study.baseline_protocol",
        ["--reference", RESULTS / "lm_exact"],
        ["lm_baseline", "lm_baseline_pass_at_k.png"],
    ),
    "tabular": (
        "benchmarks.tabular_study",
        [],
        [
            "tabular_study",
            "tabular_regime_map.png",
            "tabular_pass_at_k.png",
            "tabular_proposition1.png",
            "tabular_entropy_vs_pass1.png",
        ],
    ),
    "tabular_baseline": ("benchmarks.tabular_baseline", ["--reference", RESULTS / "tabular"], ["tabular_baseline"]),
}
# Reports another command writes from a study's cache (it has no --report-only): name -> (folder, module, files).
CACHE_COMMANDS = {"lm_long_bootstrap": ("lm_long", "benchmarks.lm_study.long_record_stats", ["lm_long_bootstrap"])}
SLOW = {"lm_exact", "lm_baseline"}
# Recomputed by the tabular report rather than read from runs: the last digits depend on the CPU's vector kernels.
RECOMPUTED = {"tabular": ("proposition1", "gradient_diagnostics")}


def report_files(names: list[str]) -> list[str]:
    """A bare name is a report's pair, ``<name>.md`` and ``<name>.json``."""
    return [f for n in names for f in ((n,) if "." in n else (f"{n}.md", f"{n}.json"))]


def regenerate(folder: str, tmp_path: Path, command: tuple[str, list, list[str], bool] | None = None) -> Path:
    """Run the study's ``--report-only`` (or ``command``: module, options, files, whether it takes --report-only)
    on a copy of its folder whose report files were deleted."""
    module, options, names, report_only = command or (*STUDIES[folder], True)
    out = tmp_path / folder
    shutil.copytree(RESULTS / folder, out, ignore=shutil.ignore_patterns("models"))
    for name in report_files(names):
        (out / name).unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", module, *(["--report-only"] if report_only else []), "--out", str(out)]
    argv += map(str, options)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def assert_close(new, old, where: str) -> None:
    if isinstance(old, dict):
        assert list(new) == list(old), where
        for key in old:
            assert_close(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert len(new) == len(old), where
        for i, (n, o) in enumerate(zip(new, old)):
            assert_close(n, o, f"{where}[{i}]")
    elif isinstance(old, float):
        assert math.isclose(new, old, rel_tol=1e-6, abs_tol=1e-12), f"{where}: {new} != {old}"
    else:
        assert new == old, where


def check_regenerated(folder: str, tmp_path: Path) -> None:
    out = regenerate(folder, tmp_path)
    for name in report_files(STUDIES[folder][2]):
        new, old = (out / name).read_bytes(), (RESULTS / folder / name).read_bytes()
        recomputed = RECOMPUTED.get(folder, ())
        if recomputed and name.endswith(".json"):
            new_json, old_json = json.loads(new), json.loads(old)
            for key in recomputed:
                assert_close(new_json.pop(key), old_json.pop(key), f"{folder}/{name}:{key}")
            assert list(new_json) == list(old_json) and new_json == old_json, f"{folder}/{name} differs"
        else:
            assert new == old, f"{folder}/{name} no longer regenerates byte for byte from the cached runs"


@pytest.mark.parametrize("folder", sorted(set(STUDIES) - SLOW))
def test_committed_report_regenerates(folder, tmp_path):
    check_regenerated(folder, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(SLOW))
def test_committed_slow_report_regenerates(folder, tmp_path):
    check_regenerated(folder, tmp_path)


@pytest.mark.parametrize("name", sorted(CACHE_COMMANDS))
def test_a_report_written_by_another_command_regenerates(name, tmp_path):
    folder, module, names = CACHE_COMMANDS[name]
    out = regenerate(folder, tmp_path, (module, [], names, False))
    for file in report_files(names):
        assert (out / file).read_bytes() == (RESULTS / folder / file).read_bytes(), f"{folder}/{file} differs"


def test_report_only_names_methods_never_run(tmp_path):
    out = tmp_path / "lm"
    shutil.copytree(RESULTS / "lm", out, ignore=shutil.ignore_patterns("models"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = ["--report-only", "--out", str(out), "--methods", "grpo", "riskpo_loo"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.lm_study.short_protocol", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "error: --methods riskpo_loo: no cached run" in error
    assert "grpo gspo riskpo riskpo_authors risk_seeking" in error
