"""``residual``: ``residual_attention``, each layer adds the previous layer's raw scores to its own
(RealFormer, He et al. 2021)."""

from __future__ import annotations

from typing import Any

from pentad.components.attention import attention_sizes
from pentad.layers.attention import ResidualAttention
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS


@ATTENTION_BLOCKS.register("residual")
class ResidualAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return bool(cfg.residual_attention)

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        return lambda index: ResidualAttention(**sizes)
