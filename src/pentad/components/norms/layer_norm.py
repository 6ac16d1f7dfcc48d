"""``layernorm``: torch's LayerNorm (biased variance inside the square root), as in Hugging Face."""

from __future__ import annotations

from torch import nn

from pentad.registry import NORMS


@NORMS.register("layernorm")
class LayerNormKind:
    description = "(x - mean) / sqrt(biased var + eps) * weight + bias (torch, Hugging Face)"
    module = nn.LayerNorm

    @staticmethod
    def build(size: int, eps: float) -> nn.LayerNorm:
        return nn.LayerNorm(size, eps=eps)
