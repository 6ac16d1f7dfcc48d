"""Transformer decoder: causal self-attention, cross-attention over the encoder memory, feed-forward."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from pentad.components.base import Decoder
from pentad.components.encoders.transformer import TransformerStackConfig
from pentad.layers.cache import KVCache
from pentad.layers.transformer import TransformerStack
from pentad.registry import DECODERS


class TransformerDecoderConfig(TransformerStackConfig):
    """Same fields as the transformer encoder; the self-attention mask is always causal, and
    ``positions: relative`` gives the decoder its own causal (one-directional) bucketed bias (T5)."""

    type: Literal["transformer"] = "transformer"


@DECODERS.register("transformer")
class TransformerDecoder(TransformerStack, Decoder):
    """hidden [B,T,H] (target embedding) and memory [B,S,H] (encoder output) -> [B,T,H].

    With a ``KVCache`` only the new target positions are run; the cross-attention keys/values are
    computed from ``memory`` on the first step and then read from the cache.
    """

    Config = TransformerDecoderConfig

    @classmethod
    def from_config(cls, cfg: TransformerDecoderConfig, model) -> TransformerDecoder:
        return cls(**cfg.stack_parts(model, "causal", cross_attention=True))

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, memory: Tensor | None,
                memory_padding_mask: Tensor | None, positions: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        return self.run(hidden, padding_mask, None, positions, cache, memory, memory_padding_mask)
