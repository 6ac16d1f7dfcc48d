"""``cross``: a decoder layer's attention over the encoder memory (queries ``q``, the memory's keys and
values ``kv``); asked for by name, never the self-attention."""

from __future__ import annotations

from typing import Any

from pentad.components.attention import attention_sizes
from pentad.layers.attention import CrossAttention
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS


@ATTENTION_BLOCKS.register("cross")
class CrossAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return False

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        return lambda index: CrossAttention(**sizes)
