"""Every committed study report is a function of its cached runs: ``--report-only`` on a copy of the study's folder,
its reports deleted, writes them again. The markdown comes back byte for byte. The JSON comes back with the same
keys, strings and integers, and every float within 1e-9 relative: numpy's vector kernels differ between CPUs (the
reports were written on one without AVX-512 or with it), which moves the last one or two digits. A figure comes back
at the same size with at most 0.01% of its pixels changed, for the same reason.

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


# The widest float difference between CPUs seen so far is 4e-12 relative; a real change in a report moves far more.
FLOAT_REL_TOL = 1e-9
# The share of a figure's pixels that may change between CPUs (13 of 1.3 million seen so far).
PIXEL_SHARE_TOL = 1e-4


def assert_same_up_to_cpu_digits(new, old, where: str) -> None:
    """Equal, except floats within FLOAT_REL_TOL of each other."""
    if isinstance(old, float) and isinstance(new, float):
        assert math.isclose(new, old, rel_tol=FLOAT_REL_TOL, abs_tol=1e-15), f"{where}: {new} != {old}"
    elif isinstance(old, dict):
        assert isinstance(new, dict) and list(new) == list(old), f"{where}: keys differ"
        for key in old:
            assert_same_up_to_cpu_digits(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), f"{where}: lengths differ"
        for i, (n, o) in enumerate(zip(new, old)):
            assert_same_up_to_cpu_digits(n, o, f"{where}[{i}]")
    else:
        assert type(new) is type(old) and new == old, f"{where}: {new!r} != {old!r}"


def assert_same_figure(new: bytes, old: bytes, where: str) -> None:
    if new == old:
        return
    import io

    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(data)).convert("RGBA")) for data in (new, old))
    assert a.shape == b.shape, f"{where}: the figure's size changed ({a.shape} != {b.shape})"
    share = float((a != b).any(axis=-1).mean())
    assert share <= PIXEL_SHARE_TOL, f"{where}: {share:.4%} of the figure's pixels changed"


def assert_report_file_regenerated(name: str, new: bytes, old: bytes, where: str, recomputed=()) -> None:
    """One report file against its committed copy, as the module docstring says."""
    if name.endswith(".json"):
        new_json, old_json = json.loads(new), json.loads(old)
        for key in recomputed:
            assert_close(new_json.pop(key), old_json.pop(key), f"{where}:{key}")
        assert_same_up_to_cpu_digits(new_json, old_json, where)
    elif name.endswith(".png"):
        assert_same_figure(new, old, where)
    else:
        assert new == old, f"{where} no longer regenerates byte for byte from the cached runs"


def check_regenerated(folder: str, tmp_path: Path) -> None:
    out = regenerate(folder, tmp_path)
    for name in report_files(STUDIES[folder][2]):
        new, old = (out / name).read_bytes(), (RESULTS / folder / name).read_bytes()
        assert_report_file_regenerated(name, new, old, f"{folder}/{name}", RECOMPUTED.get(folder, ()))


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
        new, old = (out / file).read_bytes(), (RESULTS / folder / file).read_bytes()
        assert_report_file_regenerated(file, new, old, f"{folder}/{file}")


def test_the_comparison_refuses_a_change_beyond_the_cpus_last_digits():
    report = json.dumps({"verdict": "equivalent", "estimate": -0.004, "n": 64}).encode()
    assert_report_file_regenerated("r.json", report.replace(b"-0.004", b"-0.00400000000001"), report, "r")
    for changed in (b"-0.004001", b"[-0.004]", b'"-0.004"'):
        with pytest.raises(AssertionError):
            assert_report_file_regenerated("r.json", report.replace(b"-0.004", changed), report, "r")
    with pytest.raises(AssertionError):
        assert_report_file_regenerated("r.json", report.replace(b"64", b"64.0"), report, "r")
    with pytest.raises(AssertionError):
        assert_report_file_regenerated("r.md", b"| 0.101 |", b"| 0.100 |", "r")


def test_a_figure_with_a_visible_change_is_refused():
    import io

    import numpy as np
    from PIL import Image

    def png(pixels):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        return buffer.getvalue()

    blank = np.full((200, 200, 3), 255, dtype=np.uint8)
    speck, block = blank.copy(), blank.copy()
    speck[0, 0] = 0  # one pixel in 40,000: within the tolerance
    block[50:60, 50:60] = 0  # a drawn square: a real change
    assert_report_file_regenerated("f.png", png(speck), png(blank), "f")
    with pytest.raises(AssertionError):
        assert_report_file_regenerated("f.png", png(block), png(blank), "f")
    with pytest.raises(AssertionError):
        assert_report_file_regenerated("f.png", png(blank[:100]), png(blank), "f")


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
