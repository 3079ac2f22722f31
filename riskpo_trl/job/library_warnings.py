"""The libraries' notices no user can act on, filtered for a run: never on import, and never by a trainer.

``riskpo-train`` installs both filters for its whole process (:func:`ignore_library_default_warnings`,
:func:`drop_deepspeed_cpu_notice`); :func:`riskpo_trl.job.build` and :func:`riskpo_trl.job.train` silence the
warnings only within the construction or the training they wrap (:func:`library_default_warnings_silenced`), so a
notebook's own filters come back after them. A trainer built directly changes no filter. This module imports no heavy
library (``riskpo-train``'s console reads :data:`LIBRARY_DEFAULT_WARNINGS` before torch loads).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from ..trainer.caller_warnings import GRADIENT_CHECKPOINTING_DEPRECATION

# (category, message regex) of warnings the libraries raise on every run, about their own defaults: TRL's GRPOConfig
# defaults `gradient_checkpointing=True` and its generation context calls `gradient_checkpointing_disable/enable`,
# names transformers 5 deprecates; torch's DataLoader says pin_memory does nothing where there is no accelerator,
# which is what transformers' default `dataloader_pin_memory=True` asks for on a CPU. Other warnings still show.
PIN_MEMORY_WITHOUT_ACCELERATOR = r"'pin_memory' argument is set as true but no accelerator is found"
LIBRARY_DEFAULT_WARNINGS = (
    (FutureWarning, GRADIENT_CHECKPOINTING_DEPRECATION),
    (UserWarning, PIN_MEMORY_WITHOUT_ACCELERATOR),
)

# DeepSpeed announces its CPU fallback on every process of a CPU run, where the CPU is what was asked for.
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU."


class _DropDeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEEPSPEED_CPU_NOTICE)


def drop_deepspeed_cpu_notice() -> None:
    """Filter :data:`DEEPSPEED_CPU_NOTICE` out of DeepSpeed's logger (idempotent), for the rest of the process;
    every other DeepSpeed message still shows. ``riskpo-train`` calls it before it parses a recipe."""
    deepspeed_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropDeepSpeedCpuNotice) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropDeepSpeedCpuNotice())


def ignore_library_default_warnings() -> None:
    """Install the filters of :data:`LIBRARY_DEFAULT_WARNINGS` (in the current ``warnings.catch_warnings`` scope)."""
    for category, message in LIBRARY_DEFAULT_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


@contextlib.contextmanager
def library_default_warnings_silenced() -> Iterator[None]:
    """Within the block only: :data:`LIBRARY_DEFAULT_WARNINGS` are ignored (a user script's own filters come back
    after it)."""
    with warnings.catch_warnings():
        ignore_library_default_warnings()
        yield
