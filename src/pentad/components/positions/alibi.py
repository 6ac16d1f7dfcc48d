"""``positions: alibi``: ALiBi's per-head linear distance penalty (Press et al. 2022; BLOOM)."""

from __future__ import annotations

from typing import Any

from pentad.layers.positions import ALiBi
from pentad.registry import POSITION_SCHEMES


@POSITION_SCHEMES.register("alibi")
class ALiBiPositions:
    @staticmethod
    def build(cfg: Any, model: Any, mask: str) -> ALiBi:
        return ALiBi(cfg.num_heads, causal=mask == "causal")
