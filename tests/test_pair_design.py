"""The performance design's arithmetic: the t quantile, the ratio's interval and the rule that sizes the pairs."""

from __future__ import annotations

import math

import pytest

from benchmarks import pair_design


@pytest.mark.parametrize(
    ("degrees_of_freedom", "printed"),  # Student's t, 0.975, as statistics tables print it
    [(1, 12.706), (4, 2.776), (10, 2.228), (11, 2.201), (15, 2.131), (20, 2.086), (30, 2.042), (60, 2.000)],
)
def test_the_t_quantile_matches_the_printed_tables(degrees_of_freedom, printed):
    assert pair_design.t_quantile_975(degrees_of_freedom) == pytest.approx(printed, abs=1.5e-3)


def ratios_with_spread(n: int, spread: float, centre: float = 1.0) -> list[float]:
    """``n`` pair ratios around ``centre`` whose log ratios have exactly the sample standard deviation ``spread``."""
    signs = [(-1) ** i for i in range(n)] if n % 2 == 0 else [(-1) ** i for i in range(n - 1)] + [0]
    scale = spread / math.sqrt(sum(s * s for s in signs) / (n - 1))
    mean = sum(signs) / n
    return [centre * math.exp(scale * (s - mean)) for s in signs]


@pytest.mark.parametrize("spread", [0.01, 0.03, 0.08])
def test_the_sized_pairs_resolve_two_percent_and_one_pair_fewer_does_not(spread):
    n = pair_design.pairs_needed(spread)
    assert pair_design.ratio_interval(ratios_with_spread(n, spread))["resolved"]
    if n > 3:
        assert not pair_design.ratio_interval(ratios_with_spread(n - 1, spread))["resolved"]


def test_the_interval_is_around_the_geometric_mean_and_widens_with_the_spread():
    narrow = pair_design.ratio_interval(ratios_with_spread(10, 0.01, centre=1.05))
    wide = pair_design.ratio_interval(ratios_with_spread(10, 0.10, centre=1.05))
    assert narrow["ratio"] == pytest.approx(1.05) and narrow["low"] < 1.05 < narrow["high"]
    assert wide["high"] - wide["low"] > 5 * (narrow["high"] - narrow["low"])
    assert narrow["resolved"] and not wide["resolved"]
    assert pair_design.log_ratio_spread(ratios_with_spread(10, 0.10)) == pytest.approx(0.10)


def test_one_pair_has_no_interval_and_bad_sizes_are_refused():
    assert not pair_design.ratio_interval([1.01])["resolved"]
    with pytest.raises(ValueError, match="at least 2 pair ratios"):
        pair_design.log_ratio_spread([1.0])
    with pytest.raises(ValueError, match="half_width > 0"):
        pair_design.pairs_needed(0.01, half_width=0)


def test_a_report_shows_the_interval_or_says_there_is_none():
    interval = pair_design.ratio_interval([1.0, 1.1, 1.2])
    text = pair_design.describe_interval(interval)
    assert text == f"{interval['ratio']:.3f} ({interval['low']:.3f}-{interval['high']:.3f})"
    assert pair_design.describe_interval(pair_design.ratio_interval([1.0])) == "n/a"
    assert pair_design.describe_interval({}) == "n/a"
