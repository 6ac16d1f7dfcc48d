"""Sequence pooling: [B, S, H] -> [B, H]."""

from __future__ import annotations

import torch
from torch import Tensor

from pentad.layers.pooling_kinds import PoolingKind


def pool(hidden: Tensor, padding_mask: Tensor | None, kind: PoolingKind) -> Tensor:
    """Pool ``hidden`` [B,S,H] over the non-padding positions (padding_mask True = padding)."""
    if kind == "first":
        return hidden[:, 0]
    if padding_mask is None:
        if kind == "mean":
            return hidden.mean(dim=1)
        if kind == "max":
            return hidden.max(dim=1).values
        return hidden[:, -1]
    keep = (~padding_mask).unsqueeze(-1)  # [B,S,1]
    if kind == "mean":
        total = (hidden * keep).sum(dim=1)
        return total / keep.sum(dim=1).clamp(min=1).to(hidden.dtype)
    if kind == "max":
        return hidden.masked_fill(~keep, torch.finfo(hidden.dtype).min).max(dim=1).values
    if kind == "last":
        last = (~padding_mask).sum(dim=1).clamp(min=1) - 1  # index of the last real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {kind!r}")
