"""Learned absolute position embedding (BERT, GPT-2)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class PosEmbeddingConfig(StrictModel):
    type: Literal["pos"] = "pos"
    max_positions: int | None = Field(None, ge=1, description="table size; default model.max_seq_length")


@EMBEDDINGS.register("pos")
class PosEmbedding(EmbeddingPart):
    """Positions 0..S-1 (or ``batch.positions``) -> [B|1,S,H] from a learned table; S is the length of
    the slot's sequence (tokens, or an image's CLS and patches)."""

    Config = PosEmbeddingConfig

    def __init__(self, max_positions: int, hidden_size: int):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, hidden_size))

    @classmethod
    def from_config(cls, cfg: PosEmbeddingConfig, model) -> PosEmbedding:
        return cls(cfg.max_positions or model.max_seq_length, model.hidden_size)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        if batch.positions is not None:
            return nn.functional.embedding(batch.positions, self.weight)
        seq_len = length if length is not None else batch.tokens.shape[1]
        if seq_len > self.weight.shape[0]:
            raise ValueError(f"sequence length {seq_len} exceeds the {self.weight.shape[0]} learned positions")
        return self.weight[:seq_len].unsqueeze(0)
