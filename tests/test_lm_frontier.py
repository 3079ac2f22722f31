"""The frontier study's definition (matched Pass@1 by first crossing, the envelope over rates), its verdict rule, its
run files, and (slow) the whole protocol at the smoke size."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lm_study.frontier import frontier_difference, margin_verdict, values_at_levels
from benchmarks.lm_study.frontier_config import FrontierProtocol
from benchmarks.lm_study.frontier_store import read_run, rounded, write_run


def test_values_at_levels_interpolates_at_the_first_crossing():
    pass1 = np.array([0.10, 0.20, 0.15, 0.30])
    values = np.array([[0.0, 1.0], [1.0, 3.0], [5.0, 5.0], [2.0, 9.0]])
    out = values_at_levels(pass1, values, np.array([0.05, 0.15, 0.25, 0.35]))
    np.testing.assert_allclose(out[0], values[0])  # at or below the start: the start's values
    np.testing.assert_allclose(out[1], [0.5, 2.0])  # halfway from checkpoint 0 to 1, the same weight per problem
    # 0.25 is first reached at checkpoint 3; the dip at checkpoint 2 (0.15) is its left end: weight 2/3
    np.testing.assert_allclose(out[2], [5.0 + (2.0 - 5.0) * 2 / 3, 5.0 + (9.0 - 5.0) * 2 / 3])
    assert np.isnan(out[3]).all()  # never reached


def _arm(level_values, seeds=3, problems=40, noise=0.0, seed=0):
    """(seeds, levels, problems) with each level's value, NaN levels kept NaN."""
    rng = np.random.default_rng(seed)
    base = np.asarray(level_values, dtype=np.float64)[None, :, None]
    return base + noise * rng.standard_normal((seeds, len(level_values), problems))


def test_frontier_takes_each_methods_best_rate_per_level_and_clips_to_the_common_range():
    levels = [0.1, 0.2, 0.3]
    grpo = [_arm([0.5, 0.5, np.nan]), _arm([0.4, 0.6, np.nan])]  # GRPO never reaches 0.3
    variant = [_arm([0.52, 0.62, 0.7])]
    diff = frontier_difference(variant, grpo, levels, resamples=200)
    assert diff.levels == (0.1, 0.2)
    # envelope of GRPO: 0.5 at 0.1, 0.6 at 0.2; the variant is 0.02 above both
    assert diff.estimate == pytest.approx(0.02)


def test_a_rate_counts_at_a_level_only_if_every_seed_reaches_it():
    levels = [0.1, 0.2]
    partial = _arm([0.5, 0.9])
    partial[0, 1] = np.nan  # one seed never reaches 0.2: the arm has no value there
    reference = [_arm([0.5, 0.5])]
    diff = frontier_difference([partial], reference, levels, resamples=200)
    assert diff.levels == (0.1,) and diff.estimate == pytest.approx(0.0)
    none = frontier_difference([_arm([np.nan, np.nan])], reference, levels, resamples=200)
    assert none.estimate is None and margin_verdict(none.low, none.high, 0.01) == "no common Pass@1 level"


def test_frontier_verdicts_follow_the_margin():
    levels = [0.1, 0.2]
    reference = [_arm([0.5, 0.5], noise=0.05, seed=1)]
    ahead = frontier_difference([_arm([0.55, 0.55], noise=0.05, seed=2)], reference, levels, resamples=500)
    assert margin_verdict(ahead.low, ahead.high, 0.01) == "better"
    behind = frontier_difference([_arm([0.45, 0.45], noise=0.05, seed=2)], reference, levels, resamples=500)
    assert margin_verdict(behind.low, behind.high, 0.01) == "worse"
    same = frontier_difference(
        [_arm([0.5, 0.5], noise=0.001, seed=2)], [_arm([0.5, 0.5], noise=0.001, seed=1)], levels, resamples=500
    )
    assert margin_verdict(same.low, same.high, 0.01) == "equivalent"
    assert margin_verdict(-0.02, 0.005, 0.01) == "undecided"
    assert margin_verdict(0.005, 0.03, 0.01) == "undecided"


def test_run_files_round_trip_and_refuse_another_format(tmp_path):
    path = tmp_path / "low" / "runs" / "x.json"
    payload = {"checkpoints": [{"test_p": rounded({"2digit": [0.123456789, 1.23456789e-9]}, 6)}]}
    write_run(path, payload)
    assert not path.exists() and path.with_name("x.json.gz").exists()  # written gzip'd next to its name
    back = read_run(path)
    assert back["checkpoints"][0]["test_p"]["2digit"] == [0.123457, 1.23457e-09]
    assert read_run(tmp_path / "missing.json") is None
    import gzip
    import json

    path.with_name("x.json.gz").write_bytes(gzip.compress(json.dumps({"format": 99}).encode()))
    with pytest.raises(ValueError, match="format 99"):
        read_run(path)


def test_a_packed_frontier_run_reads_the_same_and_counts_as_cached(tmp_path):
    from benchmarks import store
    from benchmarks._common import json_exists

    path = tmp_path / "low" / "runs" / "x.json"
    write_run(path, {"checkpoints": [{"test_p": rounded({"2digit": [0.1 * i for i in range(12)]}, 6)}]})
    before = read_run(path)
    store.main(["pack", str(tmp_path)])
    assert not path.with_name("x.json.gz").exists() and json_exists(path)
    assert read_run(path) == before


def test_protocol_checkpoints_and_levels_are_the_registered_ones():
    protocol = FrontierProtocol()
    checkpoints = protocol.checkpoints()
    assert checkpoints[:10] == tuple(range(5, 55, 5))
    assert checkpoints[10:] == tuple(range(75, 625, 25))
    levels = protocol.pass1_levels("moderate")
    assert levels[0] == 0.130 and levels[-1] == 0.142 and len(levels) == 13


def test_post_hoc_levels_continue_the_grid_up_to_what_every_seed_of_some_arm_reaches():
    from types import SimpleNamespace

    from benchmarks.lm_study.frontier_report import levels_beyond

    def run(*pass1):  # one problem, so its success probability is the run's Pass@1
        return {"checkpoints": [{"test_p": {"b": [p]}} for p in pass1]}

    protocol = FrontierProtocol()
    start = SimpleNamespace(
        protocol=protocol,
        levels=protocol.pass1_levels("low"),
        start_eval={"test_p": {"b": [0.08]}},
        buckets=["b"],
        runs_by_arm={("grpo", 1e-5): [run(0.1, 0.1055), run(0.107)], ("riskpo", 1e-5): [run(0.109, 0.0)]},
    )
    # GRPO's seeds both reach 0.105 (not 0.106); riskpo's one seed peaks at 0.109 and dips after.
    assert levels_beyond(start).tolist() == [0.103, 0.104, 0.105, 0.106, 0.107, 0.108, 0.109]
    start.runs_by_arm = {("grpo", 1e-5): [run(0.1, 0.1055), run(0.107)]}
    assert levels_beyond(start).tolist() == [0.103, 0.104, 0.105]
    start.runs_by_arm = {("grpo", 1e-5): [run(0.1)], ("riskpo", 1e-5): []}
    assert levels_beyond(start).size == 0  # nothing above the interval
    start.runs_by_arm = {}
    assert levels_beyond(start).size == 0  # no finished run yet


@pytest.mark.slow
def test_frontier_protocol_smoke_runs_in_order_resumes_and_reports(tmp_path):
    from benchmarks.lm_study import frontier_protocol, plans

    argv = ["--smoke", "--out", str(tmp_path), "--workers", "0"]
    payload = frontier_protocol.main(argv)
    protocol = FrontierProtocol().scaled_down()
    jobs = plans.frontier_runs(protocol, tmp_path, tmp_path)
    assert payload["runs_finished"] == payload["runs_named"] == len(jobs)
    # The grid first (seed 0, ruled methods), then the fresh seeds, each with every arm from both starts.
    grid = len(protocol.exact.starts) * len(protocol.ruled_methods) * len(protocol.grid_rates)
    assert {(j.method, j.seed) for j in jobs[:grid]} == {(m, 0) for m in protocol.ruled_methods}
    for start in protocol.exact.starts:
        for method in protocol.ruled_methods:
            lr = plans.chosen_lr(protocol, tmp_path, tmp_path, start, method)
            assert [j.lr for j in jobs[grid:] if j.start == start and j.method == method] == [lr]
    run = read_run(plans.frontier_path(tmp_path, jobs[-1]))
    assert [c["generation_batch"] for c in run["checkpoints"]] == list(protocol.checkpoints())
    rows = payload["starts"]["low"]["verdicts"]
    assert {(r["variant"], r["role"]) for r in rows} == {
        (v, role) for v in protocol.variants for role in ("primary", "secondary")
    }
    assert payload["figure"] and (tmp_path / payload["figure"]).exists()
    post_hoc = payload["starts"]["low"]["post_hoc"]
    assert len(post_hoc["beyond_interval"]) == 2 * len(protocol.variants) and post_hoc["end_points"]
    assert "### Post hoc (not pre-registered, descriptive)" in (tmp_path / "lm_frontier.md").read_text()

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json.gz")}
    frontier_protocol.main(argv)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/runs/*.json.gz")} == stamps

    # With a GRPO run missing, the report regenerates from the cache and marks the rows interim.
    missing = plans.frontier_path(tmp_path, next(j for j in jobs if j.start == "low" and j.method == "grpo"))
    missing.with_name(missing.name + ".gz").unlink()  # a run is named by its plain path and written gzip'd
    partial = frontier_protocol.main([*argv, "--report-only"])
    assert partial["runs_finished"] == partial["runs_named"] - 1 and not partial["complete"]
    assert "interim (0-1 of 1 seeds per arm)" in (tmp_path / "lm_frontier.md").read_text()


@pytest.mark.parametrize("start", ["moderate", "low"])
def test_the_grid_reuses_the_exact_protocols_committed_runs_and_start_evaluations(start):
    """The committed results are compact (packed): the grid must still find the exact protocol's seed-0 runs it
    reuses, and the report the start evaluations, or the plan would silently grow and the report lose its starts."""
    from benchmarks._common import RESULTS_DIR, json_exists
    from benchmarks.lm_study.plans import grid_score, reused_grid_path

    protocol, reference = FrontierProtocol(), RESULTS_DIR / "lm_exact"
    for method in protocol.ruled_methods:
        lr = protocol.exact.lr(start, method)
        assert reused_grid_path(protocol, reference, start, method, lr) is not None, (method, lr)
        assert grid_score(protocol, RESULTS_DIR / "lm_frontier", reference, start, method, lr) is not None
    assert json_exists(reference / start / "start_eval.json")
