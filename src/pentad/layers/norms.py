"""Normalisation layers: LayerNorm and RMSNorm (LLaMA, and T5's "layer norm", the same formula)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

NormKind = Literal["layernorm", "rmsnorm", "t5"]
NORM_KINDS = ("layernorm", "rmsnorm", "t5")


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension (Zhang & Sennrich 2019).

    No mean subtraction and no bias. T5's ``T5LayerNorm`` and LLaMA's ``RMSNorm`` compute exactly
    this; the statistic is taken in fp32 so bf16/fp16 activations do not lose it, and the result is
    cast back to the input dtype before the scale (the LLaMA order). ``weight`` starts at ones
    (TencentPretrain initialises it to N(0, 0.02), which zeroes the signal; see its defect 6).
    """

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def make_norm(kind: str, size: int, eps: float) -> nn.Module:
    """``layernorm`` -> nn.LayerNorm (weight and bias); ``rmsnorm`` / ``t5`` -> RMSNorm (weight)."""
    if kind == "layernorm":
        return nn.LayerNorm(size, eps=eps)
    if kind in ("rmsnorm", "t5"):
        return RMSNorm(size, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected one of {', '.join(NORM_KINDS)}")
