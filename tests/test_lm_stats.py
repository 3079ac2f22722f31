"""The tiny-LM study's bootstrap statistics: intervals that must include or exclude 0, pairing, the seed level,
reproducibility and the verdict rule."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lm_study.stats import paired_problem_bootstrap, two_level_bootstrap, verdict


def test_no_difference_gives_an_interval_around_zero():
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 300)
    a = base + rng.choice([-0.05, 0.05], 300)  # symmetric per-problem noise: the true mean difference is 0
    interval = paired_problem_bootstrap(a, base, resamples=4000, seed=0)
    assert interval.low < 0 < interval.high and not interval.excludes_zero()
    assert verdict(interval) == "not significant"


def test_consistent_difference_excludes_zero_and_pairing_matters():
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 300)  # problems of very different difficulty
    a = base + 0.01 + rng.normal(0, 0.002, 300)
    paired = paired_problem_bootstrap(a, base, resamples=4000, seed=0)
    assert paired.low > 0 and verdict(paired) == "supported" and verdict(paired, -1) == "contradicted"
    assert paired.estimate == pytest.approx(float((a - base).mean()))
    # Unpaired (each array's problems resampled independently), the difficulty spread would swamp +0.01.
    level_a = two_level_bootstrap(a, resamples=4000, seed=0)
    level_b = two_level_bootstrap(base, resamples=4000, seed=1)
    assert (level_a.high - level_a.low) > 10 * (paired.high - paired.low)
    assert level_a.low < level_b.high  # the two levels' intervals overlap


def test_the_seed_level_widens_the_interval_when_seeds_disagree():
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, (5, 200))
    shift = np.array([-0.04, 0.08, -0.03, 0.09, -0.05])[:, None]  # seeds disagree; the problems agree within a seed
    a = base + shift
    problem_level = paired_problem_bootstrap(a, base, resamples=4000, seed=0)
    two_level = two_level_bootstrap(a, base, resamples=4000, seed=0)
    assert problem_level.low > 0  # seed-averaged, the problems see a consistent +0.01
    assert two_level.low < 0 < two_level.high  # over seeds, 5 shifts of both signs do not exclude 0
    assert two_level.seeds == (5, 5) and two_level.problems == 200


def test_reproducible_from_its_seed_and_checked_input():
    rng = np.random.default_rng(4)
    a, b = rng.uniform(0, 1, (3, 100)), rng.uniform(0, 1, (2, 100))
    first = two_level_bootstrap(a, b, resamples=1000, seed=7)
    assert first == two_level_bootstrap(a, b, resamples=1000, seed=7)
    assert first != two_level_bootstrap(a, b, resamples=1000, seed=8)
    with pytest.raises(ValueError, match="same problems"):
        two_level_bootstrap(a, b[:, :50])
    with pytest.raises(ValueError, match="claimed_sign"):
        verdict(first, 0)


def test_the_rule_on_the_long_record_reads_the_recorded_numbers():
    """The record rows come from the committed long-protocol runs: a row's estimate is the difference of the
    recorded test Pass@k means, and its verdict follows its interval."""
    from dataclasses import replace

    from benchmarks._common import RESULTS_DIR, read_json
    from benchmarks.lm_study.config import ExactProtocol
    from benchmarks.lm_study.long_record_stats import record_rows

    protocol = replace(ExactProtocol(), bootstrap_resamples=200)
    rows = record_rows(RESULTS_DIR / "lm_long", protocol)
    row = next(r for r in rows if r["start"] == "moderate" and r["claim"] == "RiskPO raises Pass@1 over GRPO")

    def recorded(method: str) -> float:
        lr = protocol.lr("moderate", method)
        runs = [
            read_json(RESULTS_DIR / "lm_long" / "moderate" / "runs" / f"{method}-lr{lr:g}-seed{s}.json")["test"][
                "all"
            ]["pass@1"]
            for s in (0, 1, 2)
        ]
        return sum(runs) / 3

    assert row["two_level"]["estimate"] == pytest.approx(recorded("riskpo") - recorded("grpo"))
    for r in rows:
        low, high = r["two_level"]["low"], r["two_level"]["high"]
        assert (r["verdict"] == "not significant") == (low <= 0 <= high)
