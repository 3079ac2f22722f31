"""The checksums that show whether a weight update landed: the trainer computes them on what it sends, the server on
what its model holds after the update, and the two must agree."""

from __future__ import annotations

import math

import torch

# Summation order may differ between the two processes (another torch build), so equal tensors may give float64 sums
# that differ in the last bits; a real difference moves them by far more than this share of the absolute sum.
RELATIVE_TOLERANCE = 1e-9


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
