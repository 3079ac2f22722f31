"""The compact console line as a callback (see `riskpo_trl.console`)."""

from __future__ import annotations

from transformers.trainer_callback import ProgressCallback

from .console import compact_log_line


class CompactLogCallback(ProgressCallback):
    """tqdm progress bars as usual, but a step's metrics print as one compact line (the full set still goes to
    ``report_to`` and ``trainer_state.json``). Other logs (the run summary) print as before."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = compact_log_line(logs or {}, state.global_step, state.max_steps)
        if line is None or self.training_bar is None:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        if state.is_world_process_zero:
            self.training_bar.write(line)


def use_compact_log(trainer) -> None:
    """Swap the trainer's progress callback for `CompactLogCallback`; nothing changes when tqdm is off
    (``disable_tqdm``: the plain printer keeps printing every metric)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactLogCallback)
