"""Token embedding: a [vocab_size, hidden_size] table."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class WordEmbeddingConfig(StrictModel):
    type: Literal["word"] = "word"
    scale: bool = Field(False, description="multiply by sqrt(width) (Vaswani et al.; Pegasus, Marian)")


@EMBEDDINGS.register("word")
class WordEmbedding(EmbeddingPart):
    """tokens [B,S] -> [B,S,H]. Its ``weight`` [V,H] is what output heads tie to."""

    Config = WordEmbeddingConfig
    requires = ("tokens",)
    defines_sequence = True
    word_table = "weight"

    def __init__(self, vocab_size: int, hidden_size: int, scale: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))
        self.scale = math.sqrt(hidden_size) if scale else None

    @classmethod
    def from_config(cls, cfg: WordEmbeddingConfig, model) -> WordEmbedding:
        return cls(model.vocab_size, model.hidden_size, cfg.scale)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        out = nn.functional.embedding(batch.tokens, self.weight)
        return out * self.scale if self.scale is not None else out
