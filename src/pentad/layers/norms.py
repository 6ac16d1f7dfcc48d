"""Normalisation layers: TencentPretrain's LayerNorm and RMSNorm (LLaMA, and T5's "layer norm", the
same formula); torch's ``nn.LayerNorm`` is the third kind. Config-free: the kinds a config names are
registered in ``components/norms/``, which builds these."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


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


class OffsetRMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)`` over the last dimension, ``weight`` starting at zeros
    (Gemma 1-3): the same normalisation as :class:`RMSNorm` with the scale stored as its offset from one.
    The whole computation runs in fp32 and is cast back to the input dtype at the end (Gemma's order:
    ``(x * (1 + w))`` then the cast, where LLaMA casts before the scale)."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class UnbiasedLayerNorm(nn.Module):
    """``weight * (x - mean) / (std + eps) + bias`` over the last dimension, where ``std`` is the
    *unbiased* standard deviation (divisor H - 1) and ``eps`` is added outside the square root.

    This is TencentPretrain's (and UER-py's) default LayerNorm, its ``"layernorm": "normal"``; it
    differs from torch's ``nn.LayerNorm`` (biased variance, ``sqrt(var + eps)``) by a relative
    ~1/(2H) per norm, which compounds through a stack (about 1e-2 relative on the logits of a small
    model). Parameters are named ``weight`` and ``bias`` like ``nn.LayerNorm``'s, so a checkpoint
    keeps its keys whichever of the two kinds reads it. The statistics and the normalisation are
    computed in fp32 (bf16 and fp16 inputs too); the normalised value is cast back to the input
    dtype before the affine map, as in :class:`RMSNorm`. ``size`` must be at least 2.
    """

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        if size < 2:
            raise ValueError(f"an unbiased LayerNorm needs at least 2 features, got {size}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        if torch.is_grad_enabled() and x32.requires_grad:
            normed = _UnbiasedNormalize.apply(x32, self.eps).to(x.dtype)
        else:
            centred = x32 - x32.mean(-1, keepdim=True)
            std = x32.std(-1, keepdim=True)  # unbiased (correction 1)
            normed = (centred / (std + self.eps)).to(x.dtype)
        return self.weight * normed + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class _UnbiasedNormalize(torch.autograd.Function):
    """``(x - mean) / (unbiased std + eps)`` over the last dimension, with its gradient written out.

    Autograd of the plain formula runs ``Tensor.std`` (a Welford reduction that costs, on CPU, about
    ten times torch's whole LayerNorm) forward and again backward, plus a chain of element-wise
    gradients; here the statistics are two fast passes (mean, then the norm of the centred rows)
    and the backward is ``(g - mean(g) - y * sum(g * y) * (std + eps) / ((H - 1) std)) / (std + eps)``
    for the output ``y`` and its incoming gradient ``g`` (the mean of the last term vanishes: the
    rows of ``y`` sum to zero). Same values up to float32 rounding; about 3x faster forward and
    backward at width 128 (bench/RESULTS.md). Used where a gradient is taken; a row with zero spread
    gets a zero gradient through its std (the plain formula gives NaN there).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, eps: float) -> Tensor:
        centred = x - x.mean(-1, keepdim=True)
        std = torch.linalg.vector_norm(centred, dim=-1, keepdim=True).mul_((x.shape[-1] - 1) ** -0.5)
        inv = (std + eps).reciprocal_()
        normed = centred.mul_(inv)
        ctx.save_for_backward(normed, std, inv)
        return normed

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        normed, std, inv = ctx.saved_tensors
        # sum(g * y) * (std + eps) / ((H - 1) * std), 0 where std is 0 (there y is 0 too)
        spread = torch.where(std > 0, (grad * normed).sum(-1, keepdim=True) / (std * inv * (normed.shape[-1] - 1)),
                             0.0)
        centred_grad = grad - grad.mean(-1, keepdim=True)
        return torch.addcmul(centred_grad, normed, spread, value=-1.0).mul_(inv), None
