"""The checksums that show whether a weight update landed: the trainer computes them on what it sends, the server on
what its model holds after the update, and the two must agree.

A matrix is compared through a sketch: the checksum of a few of its columns, drawn afresh for each check from a seed
the trainer picks. The server reads those columns through the layer's own matmul (one-hot inputs), which costs
``2 x SKETCH_COLUMNS`` multiply-adds per parameter instead of the identity's ``2 x in_features``, and stays exact.
"""

from __future__ import annotations

import math

import torch

# Summation order may differ between the two processes (another torch build), so equal tensors may give float64 sums
# that differ in the last bits; a real difference moves them by far more than this share of the absolute sum.
RELATIVE_TOLERANCE = 1e-9
# Columns of each matrix a check reads back. A fault confined to a share f of a matrix's columns passes one check
# with probability (1 - f) ** SKETCH_COLUMNS; an update that changes every column (any optimizer step) cannot pass.
SKETCH_COLUMNS = 8
_MULTIPLIER, _INCREMENT = 6364136223846793005, 1442695040888963407  # Knuth's 64-bit linear congruential generator


def checksum(tensor: torch.Tensor) -> list[float]:
    """``[sum, position-weighted sum, sum of absolute values]`` in float64: a stale, zeroed or garbage tensor changes
    the first two, a permuted one the second."""
    values = tensor.detach().reshape(-1).to(torch.float64)
    ramp = torch.linspace(1.0, 2.0, values.numel(), dtype=torch.float64, device=values.device)
    return [float(values.sum()), float((values * ramp).sum()), float(values.abs().sum())]


def same_checksum(sent: list[float], held: list[float]) -> bool:
    scale = max(abs(sent[2]), abs(held[2]), 1e-30)
    return all(
        a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= RELATIVE_TOLERANCE * scale
        for a, b in zip(sent, held, strict=True)
    )


def sketch_columns(seed: int, in_features: int) -> list[int]:
    """``SKETCH_COLUMNS`` distinct columns out of ``in_features`` (all of them when fewer), drawn from ``seed`` with
    integer arithmetic only, so that the trainer and the server draw the same whatever their torch builds."""
    if in_features <= SKETCH_COLUMNS:
        return list(range(in_features))
    chosen: set[int] = set()
    state = seed % 2**64
    while len(chosen) < SKETCH_COLUMNS:
        state = (state * _MULTIPLIER + _INCREMENT) % 2**64
        chosen.add((state >> 33) % in_features)
    return sorted(chosen)


def sketch(tensor: torch.Tensor, seed: int) -> list[float]:
    """What a check compares for ``tensor``: the `checksum` of the columns `sketch_columns` draws for a matrix, of
    the whole tensor otherwise."""
    if tensor.dim() != 2:
        return checksum(tensor)
    columns = torch.tensor(sketch_columns(seed, tensor.shape[1]), device=tensor.device)
    return checksum(tensor.index_select(1, columns))
