"""Segment (token type) embedding: segment A = 0, segment B = 1."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class SegEmbeddingConfig(StrictModel):
    type: Literal["seg"] = "seg"
    num_segments: int = Field(2, ge=1)


@EMBEDDINGS.register("seg")
class SegEmbedding(EmbeddingPart):
    """segments [B,S] -> [B,S,H]. Padding is the padding mask's business, not a segment id."""

    Config = SegEmbeddingConfig
    requires = ("segments",)

    def __init__(self, num_segments: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_segments, hidden_size))

    @classmethod
    def from_config(cls, cfg: SegEmbeddingConfig, model) -> SegEmbedding:
        return cls(cfg.num_segments, model.hidden_size)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        return nn.functional.embedding(batch.segments, self.weight)
