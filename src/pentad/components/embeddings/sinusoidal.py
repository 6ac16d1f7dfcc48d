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
    spacing: Literal["vaswani", "tensor2tensor"] = Field(
        "vaswani", description="frequencies 10000^(-i/(d/2)) (Vaswani et al.; HF Pegasus, Marian) or "
        "10000^(-i/(d/2-1)) (tensor2tensor, fairseq, TencentPretrain)")
    offset: int = Field(0, ge=0, description="table row of position 0 (2 in fairseq and TencentPretrain)")


def sinusoidal_table(num_positions: int, dim: int, interleave: bool = True, spacing: str = "vaswani",
                     offset: int = 0) -> Tensor:
    """[num_positions, dim] table: angle(p, i) = (p + offset) / 10000^(i/(dim/2)) (``tensor2tensor``:
    10000^(i/(dim/2 - 1))).

    Computed in float64 and rounded once to float32, so that it equals the tables Hugging Face
    Pegasus / Marian checkpoints store (built in float64 by numpy) to the last bit almost everywhere;
    float32 angles would be off by up to ~1e-4 at position 1000."""
    half = dim // 2
    steps = half - 1 if spacing == "tensor2tensor" and half > 1 else half
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * (-math.log(10000.0) / steps))
    angles = torch.arange(offset, offset + num_positions, dtype=torch.float64)[:, None] * freqs[None, :]
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    if interleave:
        table[:, 0:2 * half:2] = torch.sin(angles)
        table[:, 1:2 * half:2] = torch.cos(angles)
    else:
        table[:, :half] = torch.sin(angles)
        table[:, half:2 * half] = torch.cos(angles)
    return table.float()


@EMBEDDINGS.register("sinusoidal")
class SinusoidalEmbedding(EmbeddingPart):
    """Positions -> [1|B,S,H]; no parameters (the table is a non-persistent buffer)."""

    Config = SinusoidalEmbeddingConfig

    def __init__(self, max_positions: int, hidden_size: int, interleave: bool = True, spacing: str = "vaswani",
                 offset: int = 0):
        super().__init__()
        self.max_positions = max_positions
        self.hidden_size = hidden_size
        self.layout = {"interleave": interleave, "spacing": spacing, "offset": offset}
        self.register_buffer("table", sinusoidal_table(max_positions, hidden_size, **self.layout),
                             persistent=False)

    @classmethod
    def from_config(cls, cfg: SinusoidalEmbeddingConfig, model) -> SinusoidalEmbedding:
        return cls(cfg.max_positions or model.max_seq_length, model.hidden_size, cfg.interleave, cfg.spacing,
                   cfg.offset)

    def reset_parameters(self) -> None:
        """Recompute the table (needed after building on the meta device)."""
        self.table = sinusoidal_table(self.max_positions, self.hidden_size, **self.layout).to(
            self.table.device if self.table.device.type != "meta" else "cpu")

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        if batch.positions is not None:
            return self.table[batch.positions]
        return self.table[: length if length is not None else batch.tokens.shape[1]].unsqueeze(0)
