"""An opt-in regime guard: a note when training sits in the low-success regime of one tiny-LM study.

Post hoc and narrow. The signal (``risk/frac_prompts_all_failed``, the share of a batch's prompts with no completion
rewarded above 0) was chosen after the tiny-LM study's runs had finished, to tell apart its two starts. Its evidence is
a 0.5M-parameter model, 20 prompts x 8 completions per generation batch, Adam at lr 3e-5 to 1e-4. There the paper's
MVaR advantage lost most of its coverage at the learning rate that suited GRPO from the start where most prompts were
all wrong, and, in the later exact-evaluation runs, also at a 3x smaller learning rate: in most seeds from such a
start, and in some from a start where fewer prompts were all wrong. The signal marked the low-success regime but
fired on many healthy runs and did not predict which runs collapsed, and nothing shows it transfers to
billion-parameter models or the paper's batches. Hence it is off by default (``regime_guard_patience=0``). The
figures are in ``docs/replication.md`` ("The regime guard"); this module keeps no study results.

When enabled, it warns once when the metric stays at or above a threshold for ``patience`` training batches in a row.
It only reads metrics, so any loop can drive it; the trainer drives it as a batch observer
(:meth:`RegimeGuard.observe_batch`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any


class RegimeWarning(UserWarning):
    """The regime guard's warning: training sits where the paper's advantage was measured to collapse."""


@dataclass
class RegimeGuard:
    """Counts consecutive training batches whose ``metric`` is at or past ``threshold`` and returns a warning once,
    on the ``patience``-th. ``patience=0`` disables it. A batch without the metric (e.g. nothing scorable) neither
    extends nor breaks the streak."""

    threshold: float
    patience: int
    metric: str = "risk/frac_prompts_all_failed"
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

    def observe_batch(self, batch: Any) -> None:
        """A trainer's batch observer: feed it each training batch's metrics and warn (on the main process) once."""
        if batch.mode != "train":
            return
        warning = self.observe(batch.metrics)
        if warning and batch.trainer.accelerator.is_main_process:
            warnings.warn(warning, RegimeWarning, stacklevel=2)

    def message(self, metrics: dict[str, float]) -> str:
        pushed = ""
        if "risk/frac_negative_advantage" in metrics:
            pushed = (
                f"; {metrics['risk/frac_negative_advantage']:.0%} of the completions pushed down, "
                f"{metrics.get('risk/frac_positive_advantage', 0.0):.0%} up"
            )
        return (
            f"RiskPO regime guard (opt-in, post hoc): for {self.streak} training batches in a row at least "
            f"{self.threshold:.0%} of the prompts had no completion with a reward above 0 (latest batch: "
            f'{metrics[self.metric]:.0%}{pushed}). {EVIDENCE} See docs/replication.md ("The regime guard"). Set '
            "regime_guard_patience=0 to turn the guard off."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "warned": self.warned}

    def load_state_dict(self, state: dict[str, Any], max_batches: int | None = None) -> None:
        """Restore :meth:`state_dict`'s output; a ``streak`` that is not a whole number from 0 to ``max_batches``
        (the training batches the checkpoint holds), or a ``warned`` that is not a JSON boolean, raises ValueError
        naming the field."""
        streak, warned = state["streak"], state["warned"]
        if isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
            raise ValueError(f"field 'streak' must be a whole number >= 0, got {str(streak)[:40]!r}")
        if max_batches is not None and streak > max_batches:
            raise ValueError(f"field 'streak' is {str(streak)[:40]}, more than the {max_batches} training batches run")
        if not isinstance(warned, bool):
            raise ValueError(f"field 'warned' must be true or false, got {warned!r}")
        self.streak, self.warned = streak, warned


# The scale of the evidence, stated with the warning so nobody reads more into it; the numbers live in the doc.
EVIDENCE = (
    "Post hoc and narrow: this signal was chosen after the runs of one tiny-LM study (a 0.5M-parameter model, 20 "
    "prompts x 8 completions per generation batch, Adam at lr 3e-5 to 1e-4). There the paper's MVaR advantage lost "
    "most of its coverage at the learning rate that suited GRPO where most prompts were all wrong, and in later runs "
    "also at a 3x smaller learning rate (in most seeds there, in some where fewer prompts were all wrong); the share "
    "of all-wrong prompts marked the low-success regime but fired on many healthy runs and did not predict which runs "
    "collapsed."
)
