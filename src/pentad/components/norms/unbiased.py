"""``layernorm_unbiased``: TencentPretrain's LayerNorm (unbiased std, eps outside the square root)."""

from __future__ import annotations

from pentad.layers.norms import UnbiasedLayerNorm
from pentad.registry import NORMS


@NORMS.register("layernorm_unbiased")
class UnbiasedLayerNormKind:
    description = "(x - mean) / (unbiased std + eps) * weight + bias (TencentPretrain's 'normal' LayerNorm)"
    module = UnbiasedLayerNorm

    @staticmethod
    def build(size: int, eps: float) -> UnbiasedLayerNorm:
        return UnbiasedLayerNorm(size, eps=eps)
