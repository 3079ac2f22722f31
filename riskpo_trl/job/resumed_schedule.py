"""Continuing a run with another ``max_steps``: the learning rate follows the schedule of the new horizon.

transformers builds the scheduler for the current ``max_steps`` and then restores the checkpoint's optimizer and
scheduler, whose learning rate is the old schedule's value at the checkpoint's step: after a finished linear decay, 0.
The scheduler's own rule (``lr_lambdas``, not saved in ``scheduler.pt``) is the new one, so from the second step on the
rate is the new schedule's, but the first step after the checkpoint trains at the stale rate. At the start of
training, :class:`ResumedScheduleCallback` sets the rate of a ``LambdaLR`` scheduler (transformers' linear, cosine,
constant ... schedules) to its rule's value at the restored step, as if the run had been planned for the new
``max_steps`` from the start; the steps already taken keep the rates they were trained with. An exact resume (the same
``max_steps``) finds the same value and changes nothing.
"""

from __future__ import annotations

import logging

from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def scheduled_rates(scheduler: LambdaLR) -> list[float]:
    """The learning rate of each parameter group that ``scheduler``'s rule gives at its current step."""
    return [base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas)]


class ResumedScheduleCallback(TrainerCallback):
    """At ``on_train_begin`` of a resumed run, bring the optimizer's learning rate to the schedule of the current
    ``max_steps`` at the restored step, and say so in one line when it changes it."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if state.global_step == 0 or not isinstance(lr_scheduler, LambdaLR):
            return
        restored = [group["lr"] for group in lr_scheduler.optimizer.param_groups]
        rates = scheduled_rates(lr_scheduler)
        if rates == restored:
            return
        # Re-apply the rule at the current step: sets each group's rate and what get_last_lr() reports (the rate
        # the trainer logs for the next step).
        lr_scheduler.last_epoch -= 1
        lr_scheduler.step()
        if state.is_world_process_zero:
            logger.warning(
                f"Continuing from step {state.global_step} with max_steps={state.max_steps}: the learning-rate "
                f"schedule is the one for {state.max_steps} steps, so step {state.global_step + 1} trains at "
                f"{rates[0]:.4g}, its value at step {state.global_step} (the checkpoint's optimizer was at "
                f"{restored[0]:.4g}, from the schedule of the run that wrote it)."
            )


def continue_schedule_on_resume(trainer) -> None:
    """Add :class:`ResumedScheduleCallback` to ``trainer`` (a `transformers.Trainer`) unless it has one."""
    if not any(isinstance(callback, ResumedScheduleCallback) for callback in trainer.callback_handler.callbacks):
        trainer.add_callback(ResumedScheduleCallback())
