"""Streams: an embedding slot, then an encoder, over the Batch fields the slot reads.

``run_stream`` is the single place an encoder is called on embedded input, for a one-stream model
(``pentad.model.Model.encode``) and for each stream of a two-stream model alike. A two-stream model
(``model.streams``, docs/streams.md) keeps its second stream's own modules in a :class:`Stream`
and its layout in a :class:`StreamPlan`; :func:`stacked` runs inputs that share one stream's
modules as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from pentad.components.base import Batch, Encoder

# Batch fields inputs of one stream may be stacked on (every one is [B,S]); see stacked().
_TOKEN_FIELDS = ("tokens", "segments", "padding_mask", "positions")


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


class Stream(nn.Module):
    """The own modules of a model's second stream: ``embedding`` (an embedding slot) and ``encoder``;
    their parameters read ``streams.<name>.embedding.*`` and ``streams.<name>.encoder.*``."""

    def __init__(self, embedding: nn.Module, encoder: Encoder):
        super().__init__()
        self.embedding = embedding
        self.encoder = encoder


@dataclass(frozen=True)
class StreamPlan:
    """The layout of a two-stream model: the streams' names in order (the first reads the batch, the
    second ``Batch.pair`` and ``Batch.negative``), their poolings, whether the second runs through
    the first's modules, and which streams each target reads (in its order)."""

    names: tuple[str, str]
    pooling: dict[str, str]
    shared: bool
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def first(self) -> str:
        return self.names[0]

    @property
    def second(self) -> str:
        return self.names[1]

    def name(self, stream: int | str) -> str:
        """A stream's name from its name or its index (0: the first, 1: the second)."""
        if isinstance(stream, int):
            if stream not in (0, 1):
                raise ValueError(f"stream index {stream}: a model with streams has streams 0 and 1")
            return self.names[stream]
        if stream not in self.names:
            raise ValueError(f"no stream named '{stream}'; the streams are {', '.join(self.names)}")
        return stream

    def needed(self) -> set[str]:
        """The streams some target reads."""
        return {n for names in self.reads.values() for n in names}


def stacked(parts: list[Batch]) -> tuple[Batch, list[int]] | None:
    """Inputs of one stream's modules (the first stream's input, the second's, hard negatives) as one
    Batch of their rows stacked in order, right-padded to the longest length, and each input's own
    length: the same states as one pass each, since every encoder ignores padding. None when they
    cannot be stacked (fields other than [B,S] token fields)."""
    has = [name for name in _TOKEN_FIELDS if getattr(parts[0], name) is not None]
    if not has or any(has != [name for name in _TOKEN_FIELDS if getattr(p, name) is not None] for p in parts):
        return None
    if any(getattr(x, name) is not None for x in parts for name in ("decoder_tokens", "pixels", "audio")):
        return None
    refs = [getattr(p, has[0]) for p in parts]
    width = max(ref.shape[1] for ref in refs)
    merged: dict[str, Tensor] = {}
    for name in _TOKEN_FIELDS:
        values = [getattr(p, name) for p in parts]
        if name == "padding_mask":
            # Without a mask an input has no padding; the added columns are padding.
            values = [torch.zeros(ref.shape, dtype=torch.bool, device=ref.device) if v is None else v
                      for v, ref in zip(values, refs)]
        elif values[0] is None:
            continue
        fill = name == "padding_mask"
        merged[name] = torch.cat([_pad_right(v, width, fill) for v in values])
    return Batch(**merged), [ref.shape[1] for ref in refs]


def _pad_right(x: Tensor, width: int, value: bool | int) -> Tensor:
    """[B,S] -> [B,width], new columns set to ``value``."""
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_full((x.shape[0], width - x.shape[1]), value)], dim=1)
