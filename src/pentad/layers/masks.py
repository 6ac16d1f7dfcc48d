"""Attention masks, built once per batch (not per layer).

The convention passed to ``scaled_dot_product_attention`` is a bool mask where **True means
"may attend"**, broadcastable to [B, heads, q, k]. ``None`` plus ``is_causal`` lets SDPA use its
fused causal kernels when there is no padding and no cache. With a key/value cache the queries are
the last ``q`` of ``k`` positions (``offset = k - q`` positions were processed before).

A sliding ``window`` W (Mistral, Gemma 2/3's local layers; Beltagy et al. 2020) lets a query at
position p see the keys at p - W + 1 .. p (itself and the W - 1 before it; in a bidirectional stack
the keys less than W away on either side). A rolling key/value cache keeps only the last W - 1
positions, so its keys start at ``key_start`` rather than 0.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

MaskKind = Literal["bidirectional", "causal", "prefix"]


def attention_mask(kind: MaskKind, seq_len: int, padding_mask: Tensor | None,
                   prefix_lengths: Tensor | None = None, device: torch.device | None = None,
                   key_len: int | None = None, window: int | None = None,
                   key_start: int = 0) -> tuple[Tensor | None, bool]:
    """Return ``(mask, is_causal)`` for SDPA.

    seq_len: number of queries; key_len: the position after the last key (default seq_len; larger
    with a cache, the queries then being the last seq_len positions). The keys are the positions
    ``key_start`` .. key_len - 1 (``key_start`` > 0: a rolling cache dropped the earlier ones).
    padding_mask: [B, key_len - key_start] bool, True at padding (keys there are never attended to).
    prefix_lengths: [B] long, for ``prefix``: positions < prefix_lengths[b] see each other.
    window: a sliding window (see the module docstring); None, or one no key is as far away as, is
    no window.
    """
    key_len = seq_len if key_len is None else key_len
    offset = key_len - seq_len
    if window is not None and kind == "prefix":
        raise ValueError("a sliding window is defined for causal and bidirectional masks, not prefix")
    if window is not None and key_len - key_start <= window:
        window = None  # every key is within the window of every query
    # With a cache (offset > 0) the mask is built anyway, so the check is skipped: it would cost
    # a host synchronisation at every decoding step on an accelerator.
    has_padding = padding_mask is not None and (offset > 0 or bool(padding_mask.any()))
    if kind == "bidirectional" and window is None:
        if not has_padding:
            return None, False
        return (~padding_mask)[:, None, None, :], False
    if kind == "causal" and not has_padding and offset == 0 and window is None:
        return None, True
    device = device or (padding_mask.device if padding_mask is not None else None)
    query = torch.arange(offset, key_len, device=device)
    key = torch.arange(key_start, key_len, device=device)
    distance = query[:, None] - key[None, :]  # [q, k]
    if kind == "bidirectional":
        assert window is not None  # returned above without one
        allowed = (distance.abs() < window)[None, None]  # [1,1,q,k]
    else:
        allowed = (distance >= 0)[None, None]
        if window is not None:
            allowed = allowed & (distance < window)[None, None]
    if kind == "prefix":
        if prefix_lengths is None:
            raise ValueError("a prefix mask needs prefix_lengths")
        in_prefix = key[None, :] < prefix_lengths[:, None]  # [B, k]: key is in the prefix
        query_in_prefix = query[None, :] < prefix_lengths[:, None]  # [B, q]
        allowed = allowed | (in_prefix[:, None, None, :] & query_in_prefix[:, None, :, None])
    if has_padding:
        allowed = allowed & (~padding_mask)[:, None, None, :]
        # A query whose every key is padding would give NaN in softmax; let it see itself.
        own = (distance == 0)[None, None]
        allowed = allowed | (own & padding_mask[:, None, offset - key_start:, None])
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
                          padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                          window: int | None = None) -> Tensor:
    """Bool mask [B|1, 1, q_len, capacity] for queries at positions ``offset`` + 0..q_len-1 over a
    static key/value buffer of ``capacity`` positions: keys after a query (not yet written) are
    hidden, as are padding keys and, with a sliding ``window``, keys ``window`` or more positions
    before the query. ``offset`` is a 0-dim long tensor, so the mask of a compiled step does not
    depend on a Python int. Otherwise as :func:`attention_mask` (``causal`` or ``prefix``; a window
    with ``causal`` only). padding_mask: [B, capacity] bool, True at padding."""
    if kind not in ("causal", "prefix"):
        raise ValueError(f"a static key/value cache serves causal or prefix attention, not {kind!r}")
    if window is not None and kind == "prefix":
        raise ValueError("a sliding window is defined for causal and bidirectional masks, not prefix")
    device = offset.device
    query = offset + torch.arange(q_len, device=device)
    key = torch.arange(capacity, device=device)
    allowed = (key[None, :] <= query[:, None])[None, None]  # [1,1,q,k]
    if window is not None and window < capacity:
        allowed = allowed & (key[None, :] > query[:, None] - window)[None, None]
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
