"""Low-rank adapters (LoRA; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

:class:`LoraLinear` takes the place of an ``nn.Linear`` and keeps its ``weight`` and ``bias`` under
the same names (the base model's state-dict keys do not change); each adapted block of output rows
("part": the query rows of a fused ``qkv`` projection, say) gets its own pair of low-rank factors,
``A`` [rank, in] and ``B`` [rows, rank], and adds ``scaling * B A x`` to those rows only. ``B``
starts at zero, so a freshly adapted layer computes exactly what the base layer computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.layers.dropout import Dropout


class LoraLinear(nn.Module):
    """``y = x W^T + b``, plus ``scaling * (dropout(x) A_p^T) B_p^T`` on the rows of each part p.

    base: the linear layer to adapt (its parameters are taken over, not copied); parts: part name ->
    (first row, end row) of ``weight`` [out, in], non-overlapping; scaling = alpha / rank.
    Parameters: ``weight``, ``bias`` (the base's), ``lora_A.<part>`` [rank, in], ``lora_B.<part>``
    [end - start, rank]. x [..., in] -> y [..., out].
    """

    def __init__(self, base: nn.Linear, parts: dict[str, tuple[int, int]], rank: int, alpha: float,
                 dropout: float = 0.0):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        ordered = sorted(parts.items(), key=lambda item: item[1][0])
        for (_, (_, end)), (name, (start, _)) in zip(ordered, ordered[1:]):
            if start < end:
                raise ValueError(f"LoRA part {name} overlaps the rows of the part before it")
        for name, (start, end) in ordered:
            if not 0 <= start < end <= self.out_features:
                raise ValueError(f"LoRA part {name}: rows {start}:{end} are outside 0:{self.out_features}")
        self.parts = dict(ordered)
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        self.dropout = Dropout(dropout) if dropout > 0 else nn.Identity()
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.ParameterDict({name: nn.Parameter(torch.empty(rank, self.in_features, device=device,
                                                                       dtype=dtype)) for name in self.parts})
        self.lora_B = nn.ParameterDict({name: nn.Parameter(torch.empty(end - start, rank, device=device,
                                                                       dtype=dtype))
                                        for name, (start, end) in self.parts.items()})
        self.reset_adapters()

    def reset_adapters(self) -> None:
        """A: Kaiming-uniform (as ``nn.Linear`` initialises its weight); B: zeros (no change at first)."""
        for name in self.parts:
            if self.lora_A[name].is_meta:
                continue
            nn.init.kaiming_uniform_(self.lora_A[name], a=math.sqrt(5))
            nn.init.zeros_(self.lora_B[name])

    def delta(self, name: str) -> Tensor:
        """``scaling * B A`` of one part: what merging adds to its rows of ``weight`` [rows, in]."""
        return (self.lora_B[name] @ self.lora_A[name]) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        h = self.dropout(x)
        pieces, row = [], 0
        for name, (start, end) in self.parts.items():
            if start > row:
                pieces.append(y[..., row:start])
            update = F.linear(F.linear(h, self.lora_A[name]), self.lora_B[name])
            pieces.append(y[..., start:end] + update * self.scaling)
            row = end
        if row < self.out_features:
            pieces.append(y[..., row:])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)

    def rows(self, x: Tensor, start: int, end: int) -> Tensor:
        """Output rows ``start:end`` (:class:`~pentad.layers.block.RowProjection`): the whole adapted
        projection, sliced (the adapters' rows need not line up with the ones asked for)."""
        return self(x)[..., start:end]

    def extra_repr(self) -> str:
        parts = ", ".join(f"{name}={start}:{end}" for name, (start, end) in self.parts.items())
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, alpha={self.alpha:g}, {parts}"


def merge_part(weight: Tensor, start: int, end: int, a: Tensor, b: Tensor, scaling: float) -> Tensor:
    """``weight`` [out, in] with ``scaling * b a`` added to rows start:end (computed in fp32, returned in
    the weight's dtype; ``weight`` itself is not changed)."""
    merged = weight.detach().to(torch.float32).clone()
    merged[start:end] += (b.detach().to(torch.float32) @ a.detach().to(torch.float32)) * scaling
    return merged.to(weight.dtype)
