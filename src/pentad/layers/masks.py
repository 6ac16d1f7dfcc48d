"""Attention masks, built once per batch (not per layer).

The convention passed to ``scaled_dot_product_attention`` is a bool mask where **True means
"may attend"**, broadcastable to [B, heads, q, k]. ``None`` plus ``is_causal`` lets SDPA use its
fused causal kernels when there is no padding and no cache. With a key/value cache the queries are
the last ``q`` of ``k`` positions (``offset = k - q`` positions were processed before).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

MaskKind = Literal["bidirectional", "causal", "prefix"]


def attention_mask(kind: MaskKind, seq_len: int, padding_mask: Tensor | None,
                   prefix_lengths: Tensor | None = None, device: torch.device | None = None,
                   key_len: int | None = None) -> tuple[Tensor | None, bool]:
    """Return ``(mask, is_causal)`` for SDPA.

    seq_len: number of queries; key_len: number of keys (default seq_len; larger with a cache, the
    queries then being the last seq_len positions). padding_mask: [B, key_len] bool, True at
    padding (keys there are never attended to). prefix_lengths: [B] long, for ``prefix``: positions
    < prefix_lengths[b] see each other.
    """
    key_len = seq_len if key_len is None else key_len
    offset = key_len - seq_len
    # With a cache (offset > 0) the mask is built anyway, so the check is skipped: it would cost
    # a host synchronisation at every decoding step on an accelerator.
    has_padding = padding_mask is not None and (offset > 0 or bool(padding_mask.any()))
    if kind == "bidirectional":
        if not has_padding:
            return None, False
        return (~padding_mask)[:, None, None, :], False
    if kind == "causal" and not has_padding and offset == 0:
        return None, True
    device = device or (padding_mask.device if padding_mask is not None else None)
    query = torch.arange(offset, key_len, device=device)
    key = torch.arange(key_len, device=device)
    allowed = (key[None, :] <= query[:, None])[None, None]  # [1,1,q,k]
    if kind == "prefix":
        if prefix_lengths is None:
            raise ValueError("a prefix mask needs prefix_lengths")
        in_prefix = key[None, :] < prefix_lengths[:, None]  # [B, k]: key is in the prefix
        query_in_prefix = query[None, :] < prefix_lengths[:, None]  # [B, q]
        allowed = allowed | (in_prefix[:, None, None, :] & query_in_prefix[:, None, :, None])
    if has_padding:
        allowed = allowed & (~padding_mask)[:, None, None, :]
        # A query whose every key is padding would give NaN in softmax; let it see itself.
        own = (key[None, :] == query[:, None])[None, None]
        allowed = allowed | (own & padding_mask[:, None, offset:, None])
    return allowed, False


def additive(mask: Tensor | None, is_causal: bool, q_len: int, k_len: int, bias: Tensor,
             dtype: torch.dtype = torch.float32) -> Tensor:
    """Fold a bool mask (or SDPA's implicit causal mask) into a float bias [.., q, k]: -inf where
    attention is not allowed. Used when a position bias (relative, ALiBi) must be added anyway."""
    bias = bias.to(dtype)
    if is_causal:
        key = torch.arange(k_len, device=bias.device)
        query = torch.arange(k_len - q_len, k_len, device=bias.device)
        mask = (key[None, :] <= query[:, None])[None, None]
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf"))


def static_attention_mask(kind: MaskKind, q_len: int, capacity: int, offset: Tensor,
                          padding_mask: Tensor | None, prefix_lengths: Tensor | None = None) -> Tensor:
    """Bool mask [B|1, 1, q_len, capacity] for queries at positions ``offset`` + 0..q_len-1 over a
    static key/value buffer of ``capacity`` positions: keys after a query (not yet written) are
    hidden, as are padding keys. ``offset`` is a 0-dim long tensor, so the mask of a compiled step
    does not depend on a Python int. Otherwise as :func:`attention_mask` (``causal`` or ``prefix``).
    padding_mask: [B, capacity] bool, True at padding."""
    if kind not in ("causal", "prefix"):
        raise ValueError(f"a static key/value cache serves causal or prefix attention, not {kind!r}")
    device = offset.device
    query = offset + torch.arange(q_len, device=device)
    key = torch.arange(capacity, device=device)
    allowed = (key[None, :] <= query[:, None])[None, None]  # [1,1,q,k]
    if kind == "prefix":
        if prefix_lengths is None:
            raise ValueError("a prefix mask needs prefix_lengths")
        in_prefix = key[None, :] < prefix_lengths[:, None]
        query_in_prefix = query[None, :] < prefix_lengths[:, None]
        allowed = allowed | (in_prefix[:, None, None, :] & query_in_prefix[:, None, :, None])
    if padding_mask is not None:
        allowed = allowed & (~padding_mask)[:, None, None, :]
        # A query whose every key is padding would give NaN in softmax; let it see itself.
        own = (key[None, :] == query[:, None])[None, None]
        allowed = allowed | (own & padding_mask.index_select(1, query)[:, None, :, None])
    return allowed
