"""Fixed sinusoidal position embedding (Vaswani et al. 2017, section 3.5)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class SinusoidalEmbeddingConfig(StrictModel):
    type: Literal["sinusoidal"] = "sinusoidal"
    max_positions: int | None = Field(None, ge=1, description="table size; default model.max_seq_length")
    interleave: bool = Field(True, description="sin/cos interleaved per dimension pair (Vaswani); "
                                                "False: all sines then all cosines (fairseq)")


def sinusoidal_table(num_positions: int, dim: int, interleave: bool = True) -> Tensor:
    """[num_positions, dim] table: angle(p, i) = p / 10000^(2i/dim)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * (-math.log(10000.0) / half))
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * freqs[None, :]
    table = torch.zeros(num_positions, dim)
    if interleave:
        table[:, 0:2 * half:2] = torch.sin(angles)
        table[:, 1:2 * half:2] = torch.cos(angles)
    else:
        table[:, :half] = torch.sin(angles)
        table[:, half:2 * half] = torch.cos(angles)
    return table


@EMBEDDINGS.register("sinusoidal")
class SinusoidalEmbedding(EmbeddingPart):
    """Positions -> [1|B,S,H]; no parameters (the table is a non-persistent buffer)."""

    Config = SinusoidalEmbeddingConfig
    requires = ("tokens",)

    def __init__(self, max_positions: int, hidden_size: int, interleave: bool = True):
        super().__init__()
        self.max_positions = max_positions
        self.hidden_size = hidden_size
        self.interleave = interleave
        self.register_buffer("table", sinusoidal_table(max_positions, hidden_size, interleave),
                             persistent=False)

    @classmethod
    def from_config(cls, cfg: SinusoidalEmbeddingConfig, model) -> SinusoidalEmbedding:
        return cls(cfg.max_positions or model.max_seq_length, model.hidden_size, cfg.interleave)

    def reset_parameters(self) -> None:
        """Recompute the table (needed after building on the meta device)."""
        self.table = sinusoidal_table(self.max_positions, self.hidden_size, self.interleave).to(
            self.table.device if self.table.device.type != "meta" else "cpu")

    def forward(self, batch: Batch) -> Tensor:
        if batch.positions is not None:
            return self.table[batch.positions]
        return self.table[: batch.tokens.shape[1]].unsqueeze(0)
