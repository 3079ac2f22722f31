"""The job layer: the guard rails a training run applies to whichever trainer it builds (RiskPOTrainer, or TRL's own
GRPOTrainer and GMPOTrainer), above the trainers and below the scripts: the start-up checks, the CPU vLLM server's
weight sync and its checks, the reward accounting, the checkpoint guards, the resumed schedule, the model card, the
libraries' notices (``guard_rails``, ``checks``, ``reward_accounting``, ``checkpoint_guards``, ``model_card``,
``resumed_schedule``, ``library_warnings``), stopping on a signal (``preemption``), one
run per output directory (``run_lock``) and the checkpoint to resume from (``last_checkpoint``). Public names load on
first use."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "guard_rails": ("build", "prepare", "train"),
    "preemption": ("STOPPED_EXIT_CODE", "stopping_on_signals"),
    "run_lock": ("lock_output_dir",),
}

if TYPE_CHECKING:
    from .guard_rails import build, prepare, train
    from .preemption import STOPPED_EXIT_CODE, stopping_on_signals
    from .run_lock import lock_output_dir

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
