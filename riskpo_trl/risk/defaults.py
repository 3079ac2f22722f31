"""The default of ``advantage_baseline``, the one setting whose default depends on another: written here only, and
asked by the config checks, the estimator, checkpoints, the model card, the CLI's help and the GRPO conversion.

Standard library only, so the command line's help reads it without loading torch.
"""

from __future__ import annotations

import logging

# An unset advantage_baseline means this one, except with the authors' scaling (resolve_advantage_baseline).
DEFAULT_ADVANTAGE_BASELINE = "loo"
PAPER_ADVANTAGE_BASELINE = "none"  # the paper's estimator subtracts nothing

logger = logging.getLogger(__name__)


def resolve_advantage_baseline(advantage_baseline: str | None, advantage_scaling: str) -> str:
    """``advantage_baseline`` when set; unset (``None``), :data:`DEFAULT_ADVANTAGE_BASELINE`, except
    :data:`PAPER_ADVANTAGE_BASELINE` with ``advantage_scaling="authors_code"``: the authors' code has no baseline and
    that scaling refuses one, so choosing their scaling alone reproduces their code."""
    if advantage_baseline is not None:
        return advantage_baseline
    return PAPER_ADVANTAGE_BASELINE if advantage_scaling == "authors_code" else DEFAULT_ADVANTAGE_BASELINE


def warn_if_resolved_by_scaling(advantage_baseline: str | None, advantage_scaling: str) -> None:
    """Say so, once per config, when an unset ``advantage_baseline`` becomes the paper's because of the scaling."""
    if advantage_baseline is None and advantage_scaling == "authors_code":
        logger.warning(
            "advantage_baseline not set with advantage_scaling='authors_code': using 'none', as the authors' "
            f"code does (the default {DEFAULT_ADVANTAGE_BASELINE!r} is refused with that scaling). Set "
            "advantage_baseline='none' to say so and silence this."
        )
