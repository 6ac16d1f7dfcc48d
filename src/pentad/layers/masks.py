"""Attention masks, built once per batch (not per layer).

The convention passed to ``scaled_dot_product_attention`` is a bool mask where **True means
"may attend"**, broadcastable to [B, heads, S_q, S_k]. ``None`` plus ``is_causal`` lets SDPA use its
fused causal kernels when there is no padding.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

MaskKind = Literal["bidirectional", "causal", "prefix"]


def attention_mask(kind: MaskKind, seq_len: int, padding_mask: Tensor | None,
                   prefix_lengths: Tensor | None = None,
                   device: torch.device | None = None) -> tuple[Tensor | None, bool]:
    """Return ``(mask, is_causal)`` for SDPA.

    padding_mask: [B, S] bool, True at padding (keys there are never attended to).
    prefix_lengths: [B] long, for ``prefix``: positions < prefix_lengths[b] see each other.
    """
    if kind == "bidirectional":
        if padding_mask is None or not bool(padding_mask.any()):
            return None, False
        return (~padding_mask)[:, None, None, :], False
    if kind == "causal" and (padding_mask is None or not bool(padding_mask.any())):
        return None, True
    device = device or (padding_mask.device if padding_mask is not None else None)
    pos = torch.arange(seq_len, device=device)
    allowed = pos[None, :] <= pos[:, None]  # [S_q, S_k], key <= query
    allowed = allowed[None, None]  # [1,1,S,S]
    if kind == "prefix":
        if prefix_lengths is None:
            raise ValueError("a prefix mask needs prefix_lengths")
        in_prefix = pos[None, :] < prefix_lengths[:, None]  # [B, S] key is in the prefix
        allowed = allowed | in_prefix[:, None, None, :]
    if padding_mask is not None:
        allowed = allowed & (~padding_mask)[:, None, None, :]
        # A fully padded query row would give NaN in softmax; let padded queries see themselves.
        eye = torch.eye(seq_len, dtype=torch.bool, device=device)[None, None]
        allowed = allowed | (eye & padding_mask[:, None, :, None])
    return allowed, False
