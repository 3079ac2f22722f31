"""Which RL runs each protocol needs, in the order they run, and where each one's file goes: the data a protocol gives
the pipeline (:mod:`benchmarks.pipeline`) and its report reads. Nothing here trains.

A plan is read again whenever a run ends: a learning-rate grid that completes names the runs at its chosen rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import json_exists, read_json

from .config import BaselineProtocol, ExactProtocol
from .frontier_config import FrontierProtocol
from .frontier_store import read_run, run_file


def run_name(method: str, lr: float, seed: int) -> str:
    return f"{method}-lr{lr:g}-seed{seed}"


@dataclass(frozen=True)
class Run:
    """One RL run as a protocol plans it: ``method`` from ``start`` at ``lr`` with ``seed``."""

    start: str
    method: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.method, self.lr, self.seed)

    @property
    def key(self) -> str:
        return f"{self.start}/{self.name}"


def best_rate(scores: Mapping[float, float | None]) -> float | None:
    """The rate with the best score (ties: the smaller), once every rate has one; else None."""
    if any(score is None for score in scores.values()):
        return None
    return max(sorted(scores), key=lambda lr: scores[lr])  # max keeps the first (smallest) on ties


def run_path(folder: Path, run: Run) -> Path:
    """A run's file in the exact, baseline and long protocols: ``<folder>/<start>/runs/<name>.json``."""
    return folder / run.start / "runs" / f"{run.name}.json"


# --- the exact protocol ---------------------------------------------------------------------------------------------


def exact_runs(protocol: ExactProtocol) -> list[Run]:
    """Per start, seed by seed, every method: whatever has finished forms paired comparisons."""
    return [
        Run(start, method, protocol.lr(start, method), seed)
        for start in protocol.starts
        for seed in protocol.seeds
        for method in protocol.methods
    ]


# --- the baseline study ---------------------------------------------------------------------------------------------


def baseline_folder(protocol: BaselineProtocol, out: Path, reference: Path, run: Run) -> Path:
    """Where a run is cached: the exact protocol's folder when it is one of its runs (same method, start and rate),
    else this study's."""
    exact = protocol.exact
    known = run.method in exact.methods and exact.lr(run.start, run.method) == run.lr
    return reference if known else out


def baseline_path(protocol: BaselineProtocol, out: Path, reference: Path, run: Run) -> Path:
    return run_path(baseline_folder(protocol, out, reference, run), run)


def baseline_grid_scores(
    protocol: BaselineProtocol, out: Path, reference: Path, start: str
) -> dict[float, float | None]:
    """Per grid rate, the final exact validation criterion of the seed-0 run (None: not finished)."""
    scores: dict[float, float | None] = {}
    for lr in protocol.learning_rates:
        path = baseline_path(protocol, out, reference, Run(start, protocol.method, lr, protocol.grid_seed))
        scores[lr] = read_json(path)["tracked"][-1]["score"] if json_exists(path) else None
    return scores


def baseline_chosen_lr(protocol: BaselineProtocol, out: Path, reference: Path, start: str) -> float | None:
    """The grid rate with the best final validation criterion (ties: the smaller), once the grid is complete."""
    return best_rate(baseline_grid_scores(protocol, out, reference, start))


def baseline_runs(protocol: BaselineProtocol, out: Path, reference: Path) -> list[Run]:
    """Every run the study needs that can be named now, in the order they run: the grid; then, per seed, the chosen
    rate from each start whose grid is complete; then the equal-lr control; last any missing reference run."""
    exact = protocol.exact
    runs = [
        Run(start, protocol.method, lr, protocol.grid_seed) for start in exact.starts for lr in protocol.learning_rates
    ]
    chosen = {start: baseline_chosen_lr(protocol, out, reference, start) for start in exact.starts}
    runs += [
        Run(start, protocol.method, chosen[start], seed)
        for seed in exact.seeds
        if seed != protocol.grid_seed
        for start in exact.starts
        if chosen[start] is not None
    ]
    control = chosen[protocol.control_start]
    if control is not None:
        runs += [Run(protocol.control_start, protocol.control_method, control, seed) for seed in exact.seeds]
    runs += [
        Run(start, method, exact.lr(start, method), seed)
        for start in exact.starts
        for seed in exact.seeds
        for method in protocol.references
    ]
    unique: dict[Path, Run] = {}
    for run in runs:
        unique.setdefault(baseline_path(protocol, out, reference, run), run)
    return list(unique.values())


# --- the frontier study ---------------------------------------------------------------------------------------------


def frontier_path(out: Path, run: Run) -> Path:
    return run_file(out, run.start, run.name)


def reused_grid_path(protocol: FrontierProtocol, reference: Path, start: str, method: str, lr: float) -> Path | None:
    """The exact protocol's cached seed-0 run of ``method`` at ``lr``, when that is the exact protocol's rate and the
    file exists (then the grid reuses it); else None."""
    exact = protocol.exact
    if method not in exact.methods or exact.lr(start, method) != lr or protocol.grid_seed not in exact.seeds:
        return None
    path = run_path(reference, Run(start, method, lr, protocol.grid_seed))
    return path if json_exists(path) else None


def grid_score(
    protocol: FrontierProtocol, out: Path, reference: Path, start: str, method: str, lr: float
) -> float | None:
    """The final exact validation criterion of the grid's seed-0 run (None: not finished)."""
    reused = reused_grid_path(protocol, reference, start, method, lr)
    if reused is not None:
        return read_json(reused)["tracked"][-1]["score"]
    run = read_run(frontier_path(out, Run(start, method, lr, protocol.grid_seed)))
    return run["checkpoints"][-1]["val_criterion"] if run else None


def chosen_lr(protocol: FrontierProtocol, out: Path, reference: Path, start: str, method: str) -> float | None:
    """``FRONTIER_RATE_RULE``: the grid rate with the best final validation criterion (ties: the smaller), once
    the grid is complete."""
    return best_rate({lr: grid_score(protocol, out, reference, start, method, lr) for lr in protocol.grid_rates})


def arms(protocol: FrontierProtocol, out: Path, reference: Path, start: str) -> list[tuple[str, float]]:
    """Every (method, rate) compared from ``start`` that can be named now (a ruled method once its grid is done)."""
    named = [(method, lr) for method, rates in protocol.fixed_arms for lr in rates]
    for method in protocol.ruled_methods:
        lr = chosen_lr(protocol, out, reference, start, method)
        if lr is not None:
            named.append((method, lr))
    return named


def frontier_runs(protocol: FrontierProtocol, out: Path, reference: Path) -> list[Run]:
    """Every run the study needs that can be named now, in the order they run: the grid runs not reused; then seed
    by seed, every arm from every start."""
    starts = protocol.exact.starts
    runs = [
        Run(start, method, lr, protocol.grid_seed)
        for start in starts
        for method in protocol.ruled_methods
        for lr in protocol.grid_rates
        if reused_grid_path(protocol, reference, start, method, lr) is None
    ]
    named = {start: arms(protocol, out, reference, start) for start in starts}
    runs += [
        Run(start, method, lr, seed) for seed in protocol.seeds for start in starts for method, lr in named[start]
    ]
    return list(dict.fromkeys(runs))
