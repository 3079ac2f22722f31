"""verl's loss granularity on TRL's ``bnpo`` loss: the token mean over fixed groups of sequences.

verl's ``token-mean`` averages the loss over the tokens of one micro-batch of ``ppo_micro_batch_size_per_gpu``
sequences, then weighs every micro-batch the same (divided by the accumulation steps, averaged over ranks). TRL's
``bnpo`` does the same over its own micro-batch of ``per_device_train_batch_size`` sequences. To get verl's weighting
with smaller micro-batches (memory), the sequences of an optimizer step are cut into groups of ``N`` (several whole
micro-batches each) and each micro-batch's ``bnpo`` loss is rescaled by

    scale = (micro-batches per step / groups per step) x (its tokens) / (its group's tokens),

which turns the step's gradient into the mean over groups of each group's token mean: verl's, with groups of ``N``.
(When the groups tile the step, the first factor is ``N / per_device_train_batch_size``; otherwise the step's last
group is smaller and weighs as much as the others, like a short last micro-batch in verl.) A group takes the
micro-batches of an optimizer step in the order micro-step, then process, so it may span processes: every rank needs
every micro-batch's token count, gathered once per generation batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import compat

# Key of a training micro-batch's factor on its bnpo loss when loss_token_mean_sequences is set.
TOKEN_MEAN_SCALE = "token_mean_scale"


def token_mean_group_scales(
    token_counts: torch.Tensor, gradient_accumulation_steps: int, micro_batches_per_group: int
) -> torch.Tensor:
    """The factor for each micro-batch's ``bnpo`` loss, from the loss tokens of every micro-batch of a generation
    batch: ``token_counts[p, k]`` is process ``p``'s ``k``-th micro-batch (shape ``(processes, steps_per_generation)``,
    ``steps_per_generation`` a multiple of ``gradient_accumulation_steps``). A group without tokens gives its
    micro-batches 0, as their loss already is."""
    processes, micro_batches = token_counts.shape
    steps = micro_batches // gradient_accumulation_steps
    per_step = gradient_accumulation_steps * processes
    # one row per optimizer step, its micro-batches in order (micro-step, process)
    by_step = token_counts.reshape(processes, steps, gradient_accumulation_steps).permute(1, 2, 0).reshape(steps, -1)
    by_step = by_step.to(torch.float64)
    group_of = torch.arange(per_step) // micro_batches_per_group
    num_groups = math.ceil(per_step / micro_batches_per_group)
    group_tokens = torch.zeros(steps, num_groups, dtype=torch.float64).index_add_(1, group_of, by_step)
    scales = (per_step / num_groups) * by_step / group_tokens[:, group_of].clamp(min=1.0)
    return scales.reshape(steps, gradient_accumulation_steps, processes).permute(2, 0, 1).reshape(processes, -1)


class TokenMeanLossMixin:
    """For `RiskPOTrainer` (its config has ``loss_token_mean_sequences``): each training micro-batch's ``bnpo`` loss
    is multiplied by its :func:`token_mean_group_scales` factor, so the optimizer step's loss is verl's token mean
    over groups of that many sequences. Without the field set, nothing changes."""

    _scaled_buffer: list | None = None  # the generation batch the loss scales below belong to
    _token_mean_scales: torch.Tensor | None = None

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        inputs = super()._prepare_inputs(generation_batch)
        if not self.model.training or self.args.loss_token_mean_sequences is None:
            return inputs
        if self._buffered_inputs is not self._scaled_buffer:  # a new generation batch: one gather for all its steps
            self._scaled_buffer = self._buffered_inputs
            self._token_mean_scales = self._gathered_token_mean_scales(self._buffered_inputs)
        index = self._step % self.args.steps_per_generation
        compat.check_buffered_micro_batch(inputs, self._buffered_inputs, index)
        return {**inputs, TOKEN_MEAN_SCALE: self._token_mean_scales[index]}

    def _gathered_token_mean_scales(self, micro_batches: list[dict[str, Any]]) -> torch.Tensor:
        """This process's loss factor for each micro-batch of the generation batch."""
        counts = torch.stack([_loss_mask(batch).sum() for batch in micro_batches]).float()
        gathered = self.accelerator.gather(counts).reshape(self.accelerator.num_processes, -1).cpu()
        scales = token_mean_group_scales(
            gathered,
            self.args.gradient_accumulation_steps,
            self.args.loss_token_mean_sequences // self.args.per_device_train_batch_size,
        )
        return scales[self.accelerator.process_index].to(counts.device, torch.float32)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        scale = inputs.get(TOKEN_MEAN_SCALE)
        return loss if scale is None else loss * scale


def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """The tokens TRL's loss averages over (its `_compute_loss` mask)."""
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"]
