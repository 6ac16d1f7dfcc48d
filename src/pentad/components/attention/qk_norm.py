"""``qk_norm``: self-attention with a norm on each query and key head (the stack's ``qk_norm``).

Every head's query and key vectors (width ``head_size``) go through a norm of the stack's kind
(``norm``, with ``layer_norm_eps``; one weight per layer for the queries, ``q_norm``, and one for the
keys, ``k_norm``, shared by the heads) before the scores: Qwen3 and Gemma 3 normalise before the
rotary rotation (``before_rotary``), HunYuan after it (``after_rotary``); the order matters, as
rotation does not commute with a norm's per-dimension weight. The key cache holds the normalised,
rotated keys. OLMo 2's norm over all heads' queries at once is another operation, not this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from torch import Tensor, nn

from pentad.components.attention import attention_sizes
from pentad.components.norms import norm_factory
from pentad.layers.attention import AttentionInputs, SelfAttention, attend
from pentad.layers.cache import LayerCache
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS

QKNormOrder = Literal["before_rotary", "after_rotary"]


class QKNormAttention(SelfAttention):
    """:class:`SelfAttention` whose query and key heads [B, heads, S, D] are normalised over D by
    ``q_norm`` and ``k_norm`` (built by ``norm``), before the rotary rotation or, with ``after_rotary``,
    after it. Its queries are always computed from the normalised projection, so it does not run for
    leading queries alone (:class:`~pentad.layers.attention.LeadingQueries` reads ``qkv`` directly)."""

    leading_queries = False

    def __init__(self, *, norm: Callable[[], nn.Module], after_rotary: bool, **sizes: Any):
        super().__init__(**sizes)
        self.q_norm, self.k_norm = norm(), norm()
        self.after_rotary = after_rotary

    def positioned(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.project(x)
        if self.after_rotary:
            q, k = inputs.rotate(q, k)
            q, k = self.q_norm(q), self.k_norm(k)
        else:
            q, k = inputs.rotate(self.q_norm(q), self.k_norm(k))
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        q, k, v = self.positioned(x, inputs, cache)
        context, _, probs = attend(q, k, v, inputs, self.scale, self._dropout_p())
        return self._output(context), probs


@ATTENTION_BLOCKS.register("qk_norm")
class QKNormAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return cfg.qk_norm is not None

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        head = cfg.head_size or model.hidden_size // cfg.num_heads
        norm = norm_factory(cfg.norm, head, cfg.layer_norm_eps)
        after = cfg.qk_norm == "after_rotary"
        return lambda index: QKNormAttention(norm=norm, after_rotary=after, **sizes)
