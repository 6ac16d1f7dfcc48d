"""``self``: multi-head self-attention with a fused ``qkv`` projection (``num_kv_heads``: grouped-query
or multi-query); the default variant."""

from __future__ import annotations

from typing import Any

from pentad.components.attention import attention_sizes
from pentad.layers.attention import SelfAttention
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS


@ATTENTION_BLOCKS.register("self")
class SelfAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return False  # the default when no other variant applies

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        return lambda index: SelfAttention(**sizes)
