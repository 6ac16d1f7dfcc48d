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


def run_stream(embedding: Any, encoder: Encoder, batch: Batch, cache: Any = None,
               output_positions: int | None = None) -> tuple[Tensor, Tensor | None]:
    """``embedding`` (an embedding slot: ``Batch -> Embedded``) then ``encoder`` over ``batch``:
    (hidden [B,S,H], padding_mask [B,S] | None). ``output_positions`` n (the caller reads only the
    first n positions, e.g. :func:`pentad.components.base.leading_positions` of the heads that read
    this stream): hidden [B,n,H] and padding_mask [B,n]; an encoder that ``trims_positions`` skips
    work for the others, another one's output is cut."""
    embedded = embedding(batch)
    lengths = None
    if encoder.mask_kind == "prefix" and batch.segments is not None:
        # Prefix positions are segment 0 (and, with left padding, the padding before them).
        lengths = prefix_lengths(batch.segments, embedded.padding_mask)
    padding_mask = embedded.padding_mask
    if output_positions is None:
        return encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache), padding_mask
    if encoder.trims_positions:
        hidden = encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache,
                         output_positions=output_positions)
    else:
        hidden = encoder(embedded.hidden, padding_mask, lengths, batch.positions, cache)[:, :output_positions]
    return hidden, padding_mask[:, :output_positions] if padding_mask is not None else None


def prefix_lengths(segments: Tensor, padding_mask: Tensor | None) -> Tensor:
    """[B]: index of the first non-prefix position of each row (segment != 0 and not padding)."""
    after = segments != 0
    if padding_mask is not None:
        after = after & ~padding_mask[:, -segments.shape[1]:]
    seq = segments.shape[1]
    index = torch.arange(seq, device=segments.device).expand_as(segments)
    return torch.where(after, index, torch.full_like(index, seq)).min(dim=1).values
