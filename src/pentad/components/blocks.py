"""The registered blocks of a transformer layer: attention and feed-forward factories.

The transformer encoder and decoder configs name a block kind per role (``ffn: dense | gated``;
attention is ``multihead``: multi-head, grouped-query or multi-query, optionally with RealFormer
residual scores); the registered class turns the stack config into a
``BlockFactory`` (layer index -> module) that ``TransformerStack`` calls for each layer. A new
feed-forward kind is one registered class here (or in its own file) plus a ``Literal`` member:
the stack itself does not change.
"""

from __future__ import annotations

from typing import Any

from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS, FFN_BLOCKS


@ATTENTION_BLOCKS.register("multihead")
class MultiHeadAttentionBlock:
    """Multi-head attention with a fused ``qkv`` projection (``num_kv_heads``: grouped-query);
    cross-attention (decoders) projects queries (``q``) and the memory's keys/values (``kv``)."""

    @staticmethod
    def factory(cfg: Any, model: Any, cross: bool = False) -> BlockFactory:
        dropout = cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout

        def make(index: int) -> Attention:
            return Attention(model.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_size, dropout, cfg.bias,
                             cfg.attention_scale, cross=cross, residual=cfg.residual_attention and not cross)

        return make


@FFN_BLOCKS.register("dense")
class DenseBlock:
    """``down(act(up x))`` of width ``ffn_size`` (BERT, GPT-2, T5 v1.0)."""

    gated = False

    @classmethod
    def factory(cls, cfg: Any, model: Any) -> BlockFactory:
        size = cfg.ffn_size or 4 * model.hidden_size
        return lambda index: FeedForward(model.hidden_size, size, cfg.activation, cfg.bias, cls.gated)


@FFN_BLOCKS.register("gated")
class GatedBlock(DenseBlock):
    """``down(act(gate x) * up x)``: SwiGLU with silu (LLaMA), GeGLU with gelu (T5 v1.1)."""

    gated = True
