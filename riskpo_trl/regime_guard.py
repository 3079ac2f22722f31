"""A guard that warns when training sits in the regime where the paper's advantage was measured to collapse.

The long-horizon study (``docs/replication.md``) measured which per-batch signal precedes a collapse; the guard
watches that one ``risk/*`` metric and warns once when it stays past a threshold for several training batches in a
row. It only reads metrics, so any loop can drive it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RegimeGuard:
    """Counts consecutive training batches whose ``metric`` is at or past ``threshold`` and returns a warning once,
    on the ``patience``-th. ``patience=0`` disables it. A batch without the metric (e.g. nothing scorable) neither
    extends nor breaks the streak."""

    threshold: float
    patience: int
    metric: str = "risk/frac_negative_advantage"
    streak: int = 0
    warned: bool = False

    def observe(self, metrics: dict[str, float]) -> str | None:
        if not self.patience or self.warned or self.metric not in metrics:
            return None
        value = metrics[self.metric]
        self.streak = self.streak + 1 if value >= self.threshold else 0
        if self.streak < self.patience:
            return None
        self.warned = True
        return self.message(metrics)

    def message(self, metrics: dict[str, float]) -> str:
        positive = metrics.get("risk/frac_positive_advantage")
        pushed_up = f" and {positive:.0%} up" if positive is not None else ""
        return (
            f"RiskPO regime guard: for {self.streak} training batches in a row at least {self.threshold:.0%} of the "
            f"completions got a negative advantage (latest batch: {metrics[self.metric]:.0%} pushed down{pushed_up}, "
            f"mean bundle score {metrics.get('risk/bundle_score_mean', float('nan')):.2f}, q_alpha "
            f"{metrics.get('risk/q_alpha', float('nan')):.2f}, q_beta {metrics.get('risk/q_beta', float('nan')):.2f}). "
            "This is the low-success regime in which the paper's MVaR advantage was measured to collapse the policy "
            f"(docs/replication.md). {REMEDIES} Set regime_guard_patience=0 to silence this warning."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "warned": self.warned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak, self.warned = int(state["streak"]), bool(state["warned"])


# Only what the study supports; kept next to the numbers in docs/replication.md ("The regime guard").
REMEDIES = (
    "What the study supports: a smaller learning rate (3x smaller kept the paper's advantage from collapsing over "
    "the short protocol), or the authors' advantage (advantage_scaling='authors_code', quantile_source='group', "
    "natural_baseline=False, credit_assignment='sum_mean'), which pushes completions both ways."
)
