"""``gemma_rmsnorm``: Gemma's RMSNorm, whose scale is ``1 + weight`` (weight starting at zeros)."""

from __future__ import annotations

from pentad.layers.norms import OffsetRMSNorm
from pentad.registry import NORMS


@NORMS.register("gemma_rmsnorm")
class GemmaRMSNormKind:
    description = "x / sqrt(mean(x^2) + eps) * (1 + weight), weight from zeros, in fp32 (Gemma)"
    module = OffsetRMSNorm

    @staticmethod
    def build(size: int, eps: float) -> OffsetRMSNorm:
        return OffsetRMSNorm(size, eps=eps)
