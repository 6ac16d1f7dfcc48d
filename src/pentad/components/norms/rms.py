"""``rmsnorm`` (LLaMA) and ``t5`` (T5's "layer norm"): the same RMSNorm under two names."""

from __future__ import annotations

from pentad.layers.norms import RMSNorm
from pentad.registry import NORMS


@NORMS.register("rmsnorm")
class RMSNormKind:
    description = "x / sqrt(mean(x^2) + eps) * weight"
    module = RMSNorm

    @staticmethod
    def build(size: int, eps: float) -> RMSNorm:
        return RMSNorm(size, eps=eps)


@NORMS.register("t5")
class T5NormKind(RMSNormKind):
    alias_of = "rmsnorm"
