"""Transformer layers and the config-free stack that encoders and decoders are built from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from pentad.layers.attention import AttentionInputs, AttentionReuse
from pentad.layers.cache import KVCache, LayerCache
from pentad.layers.dropout import Dropout
from pentad.layers.masks import additive, attention_mask, static_attention_mask
from pentad.layers.norms import make_norm
from pentad.layers.positions import RelativePositionBias, alibi_bias, rotary_cos_sin

PositionKind = Literal["none", "rotary", "relative", "alibi"]


BlockFactory = Callable[[int], nn.Module]
"""Layer index -> a new block (attention or feed-forward, a :class:`~pentad.layers.block.Block`)."""


def drop_path_rate(drop_path: float, index: int, num_layers: int, shared: bool = False) -> float:
    """Stochastic-depth rate of layer ``index`` of ``num_layers``: rising linearly from 0 at the first
    layer to ``drop_path`` at the last (DeiT, BEiT); ``shared`` (one layer applied ``num_layers``
    times, ALBERT): ``drop_path`` for every application."""
    if shared or num_layers == 1:
        return drop_path
    return drop_path * index / (num_layers - 1)


class TransformerLayer(nn.Module):
    """A transformer layer, [B,S,H] -> [B,S,H], assembled from blocks passed in: self-attention,
    optional cross-attention over an encoder memory (decoder layers), feed-forward; each
    sub-layer with a residual and a norm. The blocks are built by the caller (``attention``: an
    :class:`~pentad.layers.attention.Attention`; ``ffn``: a dense or gated ``FeedForward`` or a
    ``MoE``); the layer owns only the norms, the residuals and their dropout.

    ``post`` norm (BERT, BART; Vaswani et al. 2017): x = norm(x + sublayer(x)).
    ``pre`` norm (GPT-2, T5, LLaMA; Xiong et al. 2020): x = x + sublayer(norm(x)).
    """

    def __init__(self, attention: nn.Module, ffn: nn.Module, hidden_size: int, *,
                 norm_position: Literal["pre", "post"] = "post", norm: str = "layernorm",
                 layer_norm_eps: float = 1e-12, dropout: float = 0.1, cross_attention: nn.Module | None = None,
                 drop_path: float = 0.0):
        super().__init__()
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {drop_path}")
        self.pre_norm = norm_position == "pre"
        self.drop_path = drop_path
        self.attention = attention
        self.attention_norm = make_norm(norm, hidden_size, layer_norm_eps)
        if cross_attention is not None:
            self.cross_attention = cross_attention
            self.cross_attention_norm = make_norm(norm, hidden_size, layer_norm_eps)
        else:
            self.cross_attention = None
        self.ffn = ffn
        self.ffn_norm = make_norm(norm, hidden_size, layer_norm_eps)
        self.dropout = Dropout(dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn, keep: int | None = None) -> tuple[Tensor, Tensor | None]:
        """``keep``: ``fn`` returns the first ``keep`` positions alone; so does the sub-layer."""
        residual = x if keep is None else x[:, :keep]
        if self.pre_norm:
            out, extra = fn(norm(x))
            return residual + self._branch(out), extra
        out, extra = fn(x)
        return norm(residual + self._branch(out)), extra

    def _branch(self, out: Tensor) -> Tensor:
        """A sub-layer's output as added to the residual: dropout, then in training with ``drop_path``
        p > 0 the whole branch dropped for each example with probability p and the kept ones scaled
        by 1 / (1 - p) (stochastic depth, Huang et al. 2016, as DeiT and BEiT train ViTs)."""
        out = self.dropout(out)
        if self.drop_path and self.training:
            keep = 1.0 - self.drop_path
            out = out * out.new_empty((out.shape[0],) + (1,) * (out.dim() - 1)).bernoulli_(keep).div_(keep)
        return out

    @property
    def can_keep(self) -> bool:
        """Whether ``forward(..., keep=n)`` is available: self-attention that takes ``queries``, no
        cross-attention, a position-wise (not routed) feed-forward."""
        return self.attention.leading_queries and self.cross_attention is None and not self.ffn.routed

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                memory: Tensor | None = None, memory_inputs: AttentionInputs | None = None,
                prev_scores: Tensor | None = None, padding_mask: Tensor | None = None,
                router_input: Tensor | None = None, prev_probs: Tensor | None = None,
                want_probs: bool = False, keep: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Returns (hidden, raw attention scores when residual attention is on, the attention
        probabilities when ``want_probs``, else None). ``prev_probs``: the previous layer's attention
        probabilities, used instead of computing this layer's (attention-weight reuse).
        ``padding_mask`` [B,q] (of these positions) and ``router_input`` [B,q,H] are read only by a
        routed feed-forward (mixture of experts). ``keep``: compute, and return, the first ``keep``
        positions alone ([B,keep,H]): their queries attend to every position's keys and values, and
        the rest of the layer runs on them only (the caller checks :meth:`can_keep`)."""
        if keep is not None:
            x, _ = self._sublayer(x, self.attention_norm, lambda h: self.attention(h, inputs, queries=keep),
                                  keep)
            x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h), None))
            return x, None
        if prev_probs is None and not want_probs:
            attend = lambda h: self.attention(h, inputs, cache, prev_scores=prev_scores)  # noqa: E731
        else:
            attend = lambda h: self.attention(h, inputs, cache, prev_probs=prev_probs,  # noqa: E731
                                              want_probs=want_probs)
        x, scores = self._sublayer(x, self.attention_norm, attend)
        if self.cross_attention is not None:
            x, _ = self._sublayer(x, self.cross_attention_norm,
                                  lambda h: self.cross_attention(h, memory_inputs, cache, memory=memory))
        if self.ffn.routed:
            x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h, padding_mask, router_input), None))
        else:
            x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, scores


class TransformerStack(nn.Module):
    """``num_layers`` transformer layers with their shared inputs built once per forward.

    Layer i is assembled from ``attention(i)``, ``cross_attention(i)`` (decoders) and ``ffn(i)``:
    block factories that the builder makes from the config (``components/blocks.py``), so the
    stack knows nothing of the blocks' options. It owns what every layer reads: the attention mask
    (``mask``), the in-attention position signal (``positions``: rotary, T5 relative bias held once
    in ``relative_bias``, or ALiBi; ``num_heads`` and ``head_size`` size them), and an optional
    final norm (of the layers' kind and eps unless ``final_norm_kind`` / ``final_norm_eps`` say
    otherwise: TencentPretrain's decoder ends with its own). ``share_layers`` applies one layer
    ``num_layers`` times (ALBERT). Residual attention (RealFormer) is on when the attention blocks
    say so (``Attention.residual``). Attention-weight reuse (``attention_reuse``, an
    :class:`~pentad.layers.attention.AttentionReuse`) hands a layer whose attention block has
    ``reuse`` set the previous layer's attention probabilities, unless the reuse plan of this
    forward has it recompute its own; only the layers before a reusing one take the explicit
    (non-fused) attention path, to return their probabilities. A routed feed-forward (MoE) also
    gets the padding mask and its router input: the stack's input (the token embeddings) or the
    layer's own hidden states.

    Declared capabilities: ``mask_kind``, ``supports_cache`` (True: a ``KVCache`` runs only the
    new positions), ``supports_static_cache`` (a ``StaticKVCache`` too: not with attention-weight
    reuse, whose reusing layers cache values alone, nor with a bidirectional mask).
    """

    supports_cache = True

    @property
    def supports_static_cache(self) -> bool:
        return self.attention_reuse is None and self.mask_kind in ("causal", "prefix")

    def __init__(self, hidden_size: int, num_layers: int, num_heads: int, *, attention: BlockFactory,
                 ffn: BlockFactory, cross_attention: BlockFactory | None = None, head_size: int | None = None,
                 norm_position: Literal["pre", "post"] = "post", final_norm: bool = False,
                 mask: str = "bidirectional", dropout: float = 0.1, layer_norm_eps: float = 1e-12,
                 norm: str = "layernorm", positions: PositionKind = "none", rotary_base: float = 10000.0,
                 rotary_dim: int | None = None, relative_buckets: int = 32, relative_max_distance: int = 128,
                 share_layers: bool = False, final_norm_kind: str | None = None,
                 final_norm_eps: float | None = None, attention_reuse: AttentionReuse | None = None,
                 drop_path: float = 0.0):
        super().__init__()
        self.mask_kind = mask
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_size = head_size or hidden_size // num_heads
        self.position_kind = positions
        self.rotary_base = rotary_base
        self.rotary_dim = rotary_dim or self.head_size

        def layer(i: int) -> TransformerLayer:
            # blocks in this order (self-attention, cross-attention, feed-forward): the order their
            # construction draws random numbers in, which fixes the weights of a seeded build
            self_attention = attention(i)
            cross = cross_attention(i) if cross_attention is not None else None
            return TransformerLayer(self_attention, ffn(i), hidden_size, norm_position=norm_position, norm=norm,
                                    layer_norm_eps=layer_norm_eps, dropout=dropout, cross_attention=cross,
                                    drop_path=drop_path_rate(drop_path, i, num_layers, share_layers))

        self.layers = nn.ModuleList(layer(i) for i in range(1 if share_layers else num_layers))
        self.residual_attention = bool(self.layers[0].attention.residual)
        self.reusing = [bool(layer.attention.reuse) for layer in self.layers]
        if any(self.reusing) and attention_reuse is None:
            raise ValueError("attention blocks set to reuse probabilities need the stack's attention_reuse plan")
        if any(self.reusing) and (share_layers or self.residual_attention or self.reusing[0]):
            raise ValueError("attention reuse needs distinct layers (no share_layers), no residual attention, "
                             "and a first layer that computes its own attention")
        self.attention_reuse = attention_reuse if any(self.reusing) else None
        self.routed = any(layer.ffn.routed for layer in self.layers)
        self.relative_bias = (RelativePositionBias(num_heads, relative_buckets, relative_max_distance,
                                                   bidirectional=mask == "bidirectional")
                              if positions == "relative" else None)
        self.final_norm = (make_norm(final_norm_kind or norm, hidden_size,
                                     layer_norm_eps if final_norm_eps is None else final_norm_eps)
                           if final_norm else None)

    def attention_inputs(self, q_len: int, padding_mask: Tensor | None, prefix_lengths: Tensor | None,
                         positions: Tensor | None, offset: int | Tensor, device: torch.device,
                         dtype: torch.dtype = torch.float32, capacity: int | None = None) -> AttentionInputs:
        """Mask, position bias and rotary tables for queries at positions offset..offset+q_len-1.
        ``dtype``: the hidden states' (rotary tables are computed in fp32 and stored in it, so that
        bf16 weights give bf16 queries and keys; under autocast the hidden states stay fp32).
        ``capacity`` (a static cache): the keys are a buffer of that many positions, ``offset`` a
        0-dim tensor, and the mask hides the positions after each query (not yet written)."""
        if capacity is not None:
            if not isinstance(offset, Tensor):
                raise ValueError("a static cache's offset is a position tensor")
            k_len = capacity
            if padding_mask is not None and padding_mask.shape[1] != capacity:
                raise ValueError(f"padding_mask covers {padding_mask.shape[1]} positions but the static cache "
                                 f"holds {capacity}; pass the padding of every position of the buffer")
            mask: Tensor | None = static_attention_mask(self.mask_kind, q_len, capacity, offset, padding_mask,
                                                        prefix_lengths)
            is_causal = False
        else:
            if isinstance(offset, Tensor):
                raise ValueError("a tensor offset needs the static cache's capacity")
            k_len = offset + q_len
            if padding_mask is not None and padding_mask.shape[1] != k_len:
                raise ValueError(f"padding_mask covers {padding_mask.shape[1]} positions but the attention sees "
                                 f"{k_len} keys ({offset} cached + {q_len} new); with a cache pass the mask of "
                                 "every key position")
            mask, is_causal = attention_mask(self.mask_kind, q_len, padding_mask, prefix_lengths, device,
                                             key_len=k_len)
        if self.position_kind in ("relative", "alibi"):
            if self.relative_bias is not None:
                bias = self.relative_bias(q_len, k_len, offset)
            else:
                bias = alibi_bias(self.num_heads, q_len, k_len, offset, causal=self.mask_kind == "causal",
                                  device=device)
            mask, is_causal = additive(mask, is_causal, q_len, k_len, bias), False
        rotary = None
        if self.position_kind == "rotary":
            if positions is None:
                positions = (torch.arange(q_len, device=device) + offset)[None]
            rotary = rotary_cos_sin(positions, self.rotary_dim, self.rotary_base, dtype=dtype)
        return AttentionInputs(mask, is_causal, rotary)

    def run(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
            positions: Tensor | None = None, cache: KVCache | None = None, memory: Tensor | None = None,
            memory_padding_mask: Tensor | None = None, output_positions: int | None = None) -> Tensor:
        """hidden [B,q,H] -> [B,q,H]; with ``cache`` the q new positions follow the cached ones and
        ``padding_mask`` covers all of them ([B, cached + q]).

        ``output_positions`` n: the caller reads only the first n positions of the output, which is
        then [B,min(n,q),H]. The last layer computes just those (their queries over every position's
        keys and values; the attention output projection, feed-forward and final norm on n rows), the
        same values as the full stack up to float rounding, when it can: no cache, memory, residual
        attention, attention-weight reuse or routed feed-forward, and a layer whose blocks support
        it (:meth:`TransformerLayer.can_keep`). Otherwise the full output is cut."""
        if output_positions is not None:
            if output_positions < 1:
                raise ValueError(f"output_positions must be at least 1, got {output_positions}")
            if output_positions >= hidden.shape[1]:
                output_positions = None
            elif not self._can_keep(cache, memory):
                return self.run(hidden, padding_mask, prefix_lengths, positions, cache, memory,
                                memory_padding_mask)[:, :output_positions]
        static = cache is not None and cache.static
        if static and self.attention_reuse is not None:
            raise ValueError("a static key/value cache cannot serve attention-weight reuse (its reusing layers "
                             "cache values alone); generate with cache='dynamic'")
        offset = cache.offset if cache is not None else 0
        q_len = hidden.shape[1]
        inputs = self.attention_inputs(q_len, padding_mask, prefix_lengths, positions, offset,
                                       hidden.device, hidden.dtype, cache.capacity if static else None)
        memory_inputs = None
        if memory is not None or (cache is not None and cache.layers and cache.layers[0].cross_keys is not None):
            memory_mask = None
            # Decoding steps after the first (and every step of a static cache) skip the check: a host
            # sync per step.
            if memory_padding_mask is not None and (static or offset > 0 or bool(memory_padding_mask.any())):
                memory_mask = (~memory_padding_mask)[:, None, None, :]
            memory_inputs = AttentionInputs(memory_mask, False, None)
        if self.attention_reuse is not None:
            return self._run_reusing(hidden, inputs, cache, memory, memory_inputs, padding_mask)
        scores = None
        routing: dict[str, Tensor | None] = {}
        if self.routed:  # the padding of these positions, and the token embeddings for word-vector routing
            routing = {"padding_mask": _new_padding(padding_mask, offset, q_len, static), "router_input": hidden}
        last = self.num_layers - 1 if output_positions is not None else self.num_layers
        for i in range(last):
            layer = self.layers[i % len(self.layers)]
            hidden, scores = layer(hidden, inputs, cache.layer(i) if cache is not None else None, memory,
                                   memory_inputs, scores if self.residual_attention else None, **routing)
        if output_positions is not None:
            hidden, _ = self.layers[last % len(self.layers)](hidden, inputs, keep=output_positions)
        if cache is not None:
            cache.advance(q_len)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        return hidden

    def _can_keep(self, cache: KVCache | None, memory: Tensor | None) -> bool:
        """Whether the last layer can compute only the first positions (see :meth:`run`)."""
        return (cache is None and memory is None and self.attention_reuse is None and not self.residual_attention
                and not self.routed and self.layers[-1].can_keep)

    def _run_reusing(self, hidden: Tensor, inputs: AttentionInputs, cache: KVCache | None, memory: Tensor | None,
                     memory_inputs: AttentionInputs | None, padding_mask: Tensor | None) -> Tensor:
        """The layers with attention-weight reuse: this forward's plan says which reusing layers
        recompute; a layer returns its probabilities only when the next one reuses them."""
        plan = self.attention_reuse
        if cache is not None and plan.stochastic(self.training):
            raise ValueError("attention reuse with stochastic recomputation (0 < recompute_p < 1) in training mode "
                             "cannot run with a key/value cache: a reusing layer caches no keys on the steps it "
                             "reuses; generate in eval mode (model.eval())")
        computes = plan.plan(self.reusing, self.training)
        routing: dict[str, Tensor | None] = {}
        if self.routed:
            routing = {"padding_mask": padding_mask[:, -hidden.shape[1]:] if padding_mask is not None else None,
                       "router_input": hidden}
        probs = None
        for i, layer in enumerate(self.layers):
            reuse_next = i + 1 < len(self.layers) and not computes[i + 1]
            hidden, probs = layer(hidden, inputs, cache.layer(i) if cache is not None else None, memory,
                                  memory_inputs, None, prev_probs=None if computes[i] else probs,
                                  want_probs=reuse_next, **routing)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        return hidden


def _new_padding(padding_mask: Tensor | None, offset: int | Tensor, q_len: int, static: bool) -> Tensor | None:
    """The padding [B, q_len] of the new positions: the last q_len columns, or (a static cache, whose
    mask covers the whole buffer) the columns at offset..offset+q_len-1."""
    if padding_mask is None:
        return None
    if static:
        return padding_mask.index_select(1, offset + torch.arange(q_len, device=padding_mask.device))
    return padding_mask[:, -q_len:]
