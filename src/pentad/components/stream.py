"""One stream: an embedding slot, then an encoder, over the Batch fields the slot reads.

The single place an encoder is called on embedded input, for a one-stream model
(``pentad.model.Model.encode``) and for each stream of a two-stream model
(``pentad.components.encoders.dual``) alike; it sits below both, so neither calls back into the other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pentad.components.base import Batch, Encoder


def run_stream(embedding: Any, encoder: Encoder, batch: Batch, cache: Any = None) -> tuple[Tensor, Tensor | None]:
    """``embedding`` (an embedding slot: ``Batch -> Embedded``) then ``encoder`` over ``batch``:
    (hidden [B,S,H], padding_mask [B,S] | None)."""
    embedded = embedding(batch)
    lengths = None
    if encoder.mask_kind == "prefix" and batch.segments is not None:
        # Prefix positions are segment 0 (and, with left padding, the padding before them).
        lengths = prefix_lengths(batch.segments, embedded.padding_mask)
    hidden = encoder(embedded.hidden, embedded.padding_mask, lengths, batch.positions, cache)
    return hidden, embedded.padding_mask


def prefix_lengths(segments: Tensor, padding_mask: Tensor | None) -> Tensor:
    """[B]: index of the first non-prefix position of each row (segment != 0 and not padding)."""
    after = segments != 0
    if padding_mask is not None:
        after = after & ~padding_mask[:, -segments.shape[1]:]
    seq = segments.shape[1]
    index = torch.arange(seq, device=segments.device).expand_as(segments)
    return torch.where(after, index, torch.full_like(index, seq)).min(dim=1).values
