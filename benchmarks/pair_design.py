"""How many GRPO/RiskPO pairs a step-time ratio needs, and the interval the pairs give.

Each ABBA pair gives one ratio RiskPO / GRPO. Their logarithms are treated as independent draws, so the ratio's 95%
interval is ``exp(mean ± t * sd / sqrt(n))``, with Student's t at ``n - 1`` degrees of freedom. The sizing rule
asks for the fewest pairs whose interval, at a given spread of the log ratios, is narrower than ``± half_width``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

TARGET_HALF_WIDTH = 0.02  # the target: a ratio resolved to 2%
CONFIDENCE_Z = 1.959963984540054  # the normal quantile of 0.975
# Student's t quantile of 0.975 for 1 to 10 degrees of freedom, as printed in statistics tables.
T_TABLE_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281)


def t_quantile_975(degrees_of_freedom: int) -> float:
    """Student's t quantile of 0.975: the printed tables' values up to 10 degrees of freedom, the Cornish-Fisher
    expansion above (within 0.05% there), so the device needs no scipy."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees_of_freedom must be at least 1, got {degrees_of_freedom}")
    if degrees_of_freedom <= len(T_TABLE_975):
        return T_TABLE_975[degrees_of_freedom - 1]
    z, v = CONFIDENCE_Z, float(degrees_of_freedom)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def log_ratio_spread(ratios: Sequence[float]) -> float:
    """The sample standard deviation of the logarithms of the pair ratios."""
    if len(ratios) < 2:
        raise ValueError(f"a spread needs at least 2 pair ratios, got {len(ratios)}")
    return statistics.stdev(math.log(r) for r in ratios)


def ratio_interval(ratios: Sequence[float]) -> dict[str, float | int | bool]:
    """The geometric mean of the pair ratios and its 95% interval; ``resolved`` when it lies within ±2% of it."""
    n = len(ratios)
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if n < 2:
        return {"pairs": n, "ratio": math.exp(centre), "low": math.nan, "high": math.nan, "resolved": False}
    half = t_quantile_975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return {
        "pairs": n,
        "ratio": math.exp(centre),
        "low": math.exp(centre - half),
        "high": math.exp(centre + half),
        "half_width": math.exp(half) - 1,
        "resolved": math.exp(half) - 1 < TARGET_HALF_WIDTH,
    }


def pairs_needed(spread: float, half_width: float = TARGET_HALF_WIDTH, at_least: int = 3) -> int:
    """The fewest pairs whose 95% interval is narrower than ``± half_width`` when the log ratios spread by ``spread``
    (the t quantile grows as the pairs shrink, so the rule searches upward from ``at_least``)."""
    if spread < 0 or half_width <= 0:
        raise ValueError(f"spread must be >= 0 and half_width > 0, got {spread} and {half_width}")
    limit = math.log1p(half_width)
    n = max(at_least, 2)
    while t_quantile_975(n - 1) * spread / math.sqrt(n) >= limit:
        n += 1
    return n


def describe_interval(interval: dict) -> str:
    """``"ratio (low-high)"`` for a report, or ``"n/a"`` where there is no interval (fewer than two pairs)."""
    if not interval or math.isnan(interval.get("low", math.nan)):
        return "n/a"
    return f"{interval['ratio']:.3f} ({interval['low']:.3f}-{interval['high']:.3f})"
