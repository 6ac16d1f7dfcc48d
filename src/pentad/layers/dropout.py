"""Dropout whose masks are drawn fast on a CPU.

torch's CPU dropout draws its mask with ``bernoulli_``, one float at a time on one thread (~8 ns per
element here: 4-5 ms for the 524,288 activations of a 32 x 128 x 128 batch, 10-17 % of a small
model's training step, and a second thread does not shorten it). This module draws the mask from
random 16-bit integers instead: one 64-bit draw of torch's generator gives three of them, and an
element is dropped when its integer is below ``round(p * 2**16)``. Kept elements are scaled by
``1 / (1 - p')``, where ``p' = round(p * 2**16) / 2**16`` is the probability actually drawn (within
``2**-17`` of ``p``: 0.1 becomes 0.100006), so the output's expectation is the input, as torch's.
A forward and backward runs 1.4-1.6x as fast as ``F.dropout`` (``bench/cpu_kernels.py``; ``bench/RESULTS.md``,
"Precision on a CPU with bf16 matrix units"); the mask kept for backward is one byte per element instead
of a float.

Randomness comes from torch's default CPU generator, so ``torch.manual_seed`` makes runs
reproducible and activation checkpointing (which saves and restores that generator's state)
recomputes the same masks. The masks differ from ``F.dropout``'s for the same seed. On other devices,
and for a ``p`` that 16 bits cannot express (below ``2**-17`` or above ``1 - 2**-17``),
``F.dropout`` runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # resolution of the drop probability


def drop_mask(shape: torch.Size | tuple[int, ...], threshold: int) -> Tensor:
    """A bool mask of ``shape``, True (dropped) with probability ``threshold / 2**16``, from torch's default
    CPU generator: the low 48 bits of each non-negative int64 draw are three independent 16-bit integers."""
    n = 1
    for size in shape:
        n *= size
    words = torch.empty(-(-n // 3), dtype=torch.int64, device="cpu").random_()
    lanes = words.view(torch.int16).view(-1, 4)[:, :3]  # little-endian: the three low 16-bit lanes
    return (lanes < threshold - LEVELS // 2).view(-1)[:n].view(shape)  # int16 lanes are signed


class _MaskedScale(torch.autograd.Function):
    """x * scale where the mask keeps, 0 where it drops; the backward applies the same to the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dropped: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(dropped)
        ctx.scale = scale
        return x.mul(scale).masked_fill_(dropped, 0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (dropped,) = ctx.saved_tensors
        return grad.mul(ctx.scale).masked_fill_(dropped, 0), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with masks drawn as the module docstring says on a CPU."""
    if not training or p == 0.0:
        return x
    threshold = round(p * LEVELS)
    if x.device.type != "cpu" or not 0 < threshold < LEVELS:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, drop_mask(x.shape, threshold), LEVELS / (LEVELS - threshold))


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same place in a model, no parameters) drawing its masks with
    :func:`dropout`. ``inplace`` is not supported."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
