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

import torch


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
