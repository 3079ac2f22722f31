"""A TRL GRPO-family trainer with the per-batch seam, for studies that probe a baseline's batches (the recipes'
baselines are TRL's classes unchanged)."""

from __future__ import annotations

import functools

from .batch_hook import BatchObserversMixin


@functools.cache
def observed_trainer(trl_trainer: type) -> type:
    """``trl_trainer`` (a TRL GRPO-family trainer) with ``add_batch_observer`` (`BatchObserversMixin`), under its own
    name, the same class on every call: for the studies that probe a baseline's batches. The recipes' baselines are
    TRL's classes unchanged."""
    return type(trl_trainer.__name__, (BatchObserversMixin, trl_trainer), {"__module__": __name__})
