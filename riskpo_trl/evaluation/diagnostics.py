"""The paper's entropy diagnostic: how confident is the policy on questions it finds easy versus hard?

From evaluator records sampled with ``logprobs=True`` (each completion's mean token log-probability and score),
group questions by their reward rate (mean score over their samples) and average the completions' length-normalised
log-probabilities per group. A policy whose entropy collapsed is confident (log-prob near 0) everywhere, hard
questions included; a healthy one is less confident where it rarely succeeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LogprobBin:
    low: float  # reward-rate range [low, high) of the questions in this bin (the last bin includes 1.0)
    high: float
    num_questions: int
    num_completions: int
    mean_logprob: float
    sem_logprob: float  # standard error of the mean over completions
    mean_reward_rate: float  # mean reward rate of the questions in this bin (where a figure places its point)


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The records of an evaluator ``samples.jsonl`` (lines cut short by a crash are skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def logprob_by_reward_rate(records: Iterable[dict[str, Any]], num_bins: int = 5) -> list[LogprobBin]:
    """Mean completion log-probability per bin of question reward rate (``num_bins`` equal-width bins of [0, 1]).

    Empty bins are left out. Raises if the records carry no log-probabilities (evaluate with ``logprobs=True``).
    """
    if num_bins < 1:
        raise ValueError(f"num_bins={num_bins} must be >= 1.")
    grouped: list[tuple[list[float], int]] = [([], 0) for _ in range(num_bins)]
    rates: list[list[float]] = [[] for _ in range(num_bins)]
    found_logprobs = False
    for record in records:
        logprobs = [lp for lp in (record.get("mean_logprobs") or []) if lp is not None and math.isfinite(lp)]
        if not logprobs:
            continue
        found_logprobs = True
        rate = sum(record["scores"]) / len(record["scores"])
        index = min(int(rate * num_bins), num_bins - 1)
        values, count = grouped[index]
        grouped[index] = (values + logprobs, count + 1)
        rates[index].append(rate)
    if not found_logprobs:
        raise ValueError(
            "No completion log-probabilities in these records: run the evaluator with `--logprobs true` "
            "(EvalConfig(logprobs=True))."
        )
    bins = []
    for i, (values, count) in enumerate(grouped):
        if not values:
            continue
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        bins.append(
            LogprobBin(
                i / num_bins,
                (i + 1) / num_bins,
                count,
                len(values),
                mean,
                math.sqrt(variance / len(values)),
                sum(rates[i]) / len(rates[i]),
            )
        )
    return bins
