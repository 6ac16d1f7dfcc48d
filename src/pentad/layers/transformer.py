"""Transformer layers and the config-free stack that encoders and decoders are built from.

Everything here is assembled from built modules: a :class:`TransformerLayer` from its attention,
feed-forward and norm (made by the caller), a :class:`TransformerStack` from its layers, its position
scheme and its final norm. The config-to-module mapping is in ``components/blocks.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, cast

import torch
from torch import Tensor, nn

from pentad.layers.attention import Attention, AttentionInputs, AttentionReuse, LeadingQueries
from pentad.layers.cache import KVCache, LayerCache
from pentad.layers.dropout import Dropout
from pentad.layers.masks import additive, attention_mask, static_attention_mask
from pentad.layers.positions import PositionScheme

BlockFactory = Callable[[int], nn.Module]
"""Layer index -> a new block (attention or feed-forward, a :class:`~pentad.layers.block.Block`)."""

NormFactory = Callable[[], nn.Module]
"""-> a new norm of the layer's width (each sub-layer has its own)."""


def drop_path_rate(drop_path: float, index: int, num_layers: int, shared: bool = False) -> float:
    """Stochastic-depth rate of layer ``index`` of ``num_layers``: rising linearly from 0 at the first
    layer to ``drop_path`` at the last (DeiT, BEiT); ``shared`` (one layer applied ``num_layers``
    times, ALBERT): ``drop_path`` for every application."""
    if shared or num_layers == 1:
        return drop_path
    return drop_path * index / (num_layers - 1)


@dataclass
class LayerInputs:
    """What every layer of a stack reads in one forward besides its hidden states, built once by the
    stack: the self-attention inputs (``attention``), the cross-attention inputs with the memory
    (``memory``; decoders), and for a routed feed-forward (mixture of experts) the padding [B,q] of
    these positions and its router input [B,q,H]."""

    attention: AttentionInputs
    memory: AttentionInputs | None = None
    padding_mask: Tensor | None = None
    router_input: Tensor | None = None

    def with_probabilities(self) -> LayerInputs:
        """The same inputs, the self-attention asked for its probabilities (the next layer reuses them)."""
        return replace(self, attention=self.attention.with_probabilities())


class TransformerLayer(nn.Module):
    """A transformer layer, [B,S,H] -> [B,S,H], assembled from blocks passed in: self-attention,
    optional cross-attention over an encoder memory (decoder layers), feed-forward; each
    sub-layer with a residual and a norm (``norm()`` makes each). The blocks are built by the caller
    (``attention``: an :class:`~pentad.layers.attention.Attention` variant; ``ffn``: a dense or gated
    ``FeedForward`` or a ``MoE``); the layer owns only the norms, the residuals and their dropout and
    stochastic depth (``drop_path``).

    ``post`` norm (BERT, BART; Vaswani et al. 2017): x = norm(x + sublayer(x)).
    ``pre`` norm (GPT-2, T5, LLaMA; Xiong et al. 2020): x = x + sublayer(norm(x)).
    ``sandwich`` (Gemma 2/3; CogView's sandwich-LN, Ding et al. 2021): x = x + norm'(sublayer(norm(x))),
    each sub-layer's output normalised too (``attention_output_norm``, ``ffn_output_norm``, ...).
    """

    def __init__(self, attention: nn.Module, ffn: nn.Module, norm: NormFactory, *,
                 norm_position: Literal["pre", "post", "sandwich"] = "post", dropout: float = 0.1,
                 cross_attention: nn.Module | None = None, drop_path: float = 0.0):
        super().__init__()
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {drop_path}")
        self.pre_norm = norm_position in ("pre", "sandwich")
        sandwich = norm_position == "sandwich"
        self.drop_path = drop_path
        self.attention = attention
        self.attention_norm = norm()
        self.attention_output_norm = norm() if sandwich else None
        if cross_attention is not None:
            self.cross_attention = cross_attention
            self.cross_attention_norm = norm()
            self.cross_attention_output_norm = norm() if sandwich else None
        else:
            self.cross_attention = None
        self.ffn = ffn
        self.ffn_norm = norm()
        self.ffn_output_norm = norm() if sandwich else None
        self.dropout = Dropout(dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn, keep: int | None = None,
                  output_norm: nn.Module | None = None) -> tuple[Tensor, Tensor | None]:
        """``keep``: ``fn`` returns the first ``keep`` positions alone; so does the sub-layer.
        ``output_norm`` (sandwich): the norm of the sub-layer's output before the residual."""
        residual = x if keep is None else x[:, :keep]
        if self.pre_norm:
            out, extra = fn(norm(x))
            if output_norm is not None:
                out = output_norm(out)
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
        """Whether ``forward(..., keep=n)`` is available: self-attention that runs for leading queries
        (:class:`~pentad.layers.attention.LeadingQueries`), no cross-attention, a position-wise (not
        routed) feed-forward."""
        return self.attention.leading_queries and self.cross_attention is None and not self.ffn.routed

    def forward(self, x: Tensor, inputs: LayerInputs, cache: LayerCache | None = None,
                carried: Tensor | None = None, keep: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Returns (hidden, what the self-attention hands the next layer: its raw scores (residual
        attention), the attention probabilities (when ``inputs`` asks for them), else None).
        ``carried``: what the previous layer's attention handed on (raw scores; or the probabilities
        a reusing layer applies instead of computing its own). ``keep``: compute, and return, the first
        ``keep`` positions alone ([B,keep,H]): their queries attend to every position's keys and values,
        and the rest of the layer runs on them only (the caller checks :meth:`can_keep`)."""
        if keep is not None:
            leading = LeadingQueries(self.attention, keep)
            x, _ = self._sublayer(x, self.attention_norm, lambda h: (leading(h, inputs.attention), None), keep,
                                  self.attention_output_norm)
            x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h), None), output_norm=self.ffn_output_norm)
            return x, None
        x, carried = self._sublayer(x, self.attention_norm,
                                    lambda h: self.attention(h, inputs.attention, cache, carried),
                                    output_norm=self.attention_output_norm)
        if self.cross_attention is not None:
            x, _ = self._sublayer(x, self.cross_attention_norm, lambda h: self.cross_attention(h, inputs.memory, cache),
                                  output_norm=self.cross_attention_output_norm)
        if self.ffn.routed:
            x, _ = self._sublayer(x, self.ffn_norm,
                                  lambda h: (self.ffn(h, inputs.padding_mask, inputs.router_input), None),
                                  output_norm=self.ffn_output_norm)
        else:
            x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h), None), output_norm=self.ffn_output_norm)
        return x, carried


class TransformerStack(nn.Module):
    """``num_layers`` transformer layers with their shared inputs built once per forward.

    ``layers``: the built layers (``components/blocks.py`` assembles them from the config), one per
    layer, or a single one applied ``num_layers`` times (``share_layers``, ALBERT). The stack owns what
    every layer reads: the attention mask (``mask``), the in-attention position signal (``positions``: a
    :class:`~pentad.layers.positions.PositionScheme`, rotary, T5 relative bias held once, or ALiBi,
    registered under its ``attribute`` name), and an optional ``final_norm``. Residual attention
    (RealFormer) is on when the attention blocks say so (``Attention.residual``). Attention-weight reuse
    (``attention_reuse``, an :class:`~pentad.layers.attention.AttentionReuse`) hands a layer whose
    attention block has ``reuse`` set the previous layer's attention probabilities, unless the reuse plan
    of this forward has it recompute its own; only the layers before a reusing one take the explicit
    (non-fused) attention path, to return their probabilities. A routed feed-forward (MoE) also gets the
    padding mask and its router input: the stack's input (the token embeddings) or the layer's own
    hidden states.

    Sliding-window attention: a layer whose attention block declares a ``window`` (set when the stack
    is assembled; None: global) reads the self-attention inputs of that window, built once per forward
    beside the global ones (one set per distinct window): its mask hides the keys outside the window,
    its rotary tables are the position scheme's local ones (``local=True``: Gemma 3's local rotary
    base), and with a rolling cache (``KVCache.rolls``) its keys start at the first position the cache
    keeps (``layers/cache.py``). ``windows``: each layer's window.

    Declared capabilities: ``mask_kind``, ``supports_cache`` (True: a ``KVCache`` runs only the
    new positions), ``supports_static_cache`` (a ``StaticKVCache`` too: not with attention-weight
    reuse, whose reusing layers cache values alone, nor with a bidirectional mask).
    """

    supports_cache = True

    @property
    def supports_static_cache(self) -> bool:
        return self.attention_reuse is None and self.mask_kind in ("causal", "prefix")

    def __init__(self, layers: Sequence[TransformerLayer], num_layers: int, *, mask: str = "bidirectional",
                 positions: PositionScheme | None = None, final_norm: nn.Module | None = None,
                 attention_reuse: AttentionReuse | None = None):
        super().__init__()
        if len(layers) not in (1, num_layers):
            raise ValueError(f"{len(layers)} layers for a stack of {num_layers}: pass one per layer, or one shared")
        self.mask_kind = mask
        self.num_layers = num_layers
        share_layers = len(layers) < num_layers
        self.layers = nn.ModuleList(layers)
        # the built width of the attention (for FLOP counts; pruning heads later does not change it)
        self.num_heads, self.head_size = layers[0].attention.num_heads, layers[0].attention.head_size
        self._position_attribute = None if positions is None else positions.attribute
        if positions is not None:
            self.add_module(positions.attribute, positions)
        self.residual_attention = bool(self.layers[0].attention.residual)
        self.reusing = [bool(layer.attention.reuse) for layer in self.layers]
        if any(self.reusing) and attention_reuse is None:
            raise ValueError("attention blocks set to reuse probabilities need the stack's attention_reuse plan")
        if any(self.reusing) and (share_layers or self.residual_attention or self.reusing[0]):
            raise ValueError("attention reuse needs distinct layers (no share_layers), no residual attention, "
                             "and a first layer that computes its own attention")
        self.attention_reuse = attention_reuse if any(self.reusing) else None
        self.routed = any(layer.ffn.routed for layer in self.layers)
        self.final_norm = final_norm
        blocks = [cast(Attention, layer.attention) for layer in layers]
        self.windows: list[int | None] = [block.window for block in blocks]
        softcaps = {block.softcap for block in blocks}
        if len(softcaps) > 1:
            raise ValueError(f"the attention blocks of one stack soft-cap their scores alike, got "
                             f"{sorted(map(str, softcaps))}")
        self.softcap: float | None = softcaps.pop()
        if any(w is not None for w in self.windows) and mask == "prefix":
            raise ValueError("sliding-window attention is defined for causal and bidirectional stacks, not prefix")
        if len(set(self.windows)) > 1 and (self.residual_attention or any(self.reusing)):
            raise ValueError("residual attention and attention reuse hand scores between layers, which needs one "
                             "window for every layer (local and global layers see different keys)")

    @property
    def positions(self) -> PositionScheme | None:
        """The position scheme (None: positions come from the embedding, if at all)."""
        return None if self._position_attribute is None else self._modules[self._position_attribute]

    @property
    def position_kind(self) -> str:
        """``none``, ``rotary``, ``relative`` or ``alibi``: the position scheme's kind."""
        return "none" if self._position_attribute is None else self.positions.kind

    def attention_inputs(self, q_len: int, padding_mask: Tensor | None, prefix_lengths: Tensor | None,
                         positions: Tensor | None, offset: int | Tensor, device: torch.device,
                         dtype: torch.dtype = torch.float32, capacity: int | None = None,
                         window: int | None = None, rolling: bool = False) -> AttentionInputs:
        """Mask, position bias and rotary tables for queries at positions offset..offset+q_len-1.
        ``dtype``: the hidden states' (rotary tables are computed in fp32 and stored in it, so that
        bf16 weights give bf16 queries and keys; under autocast the hidden states stay fp32).
        ``capacity`` (a static cache): the keys are a buffer of that many positions, ``offset`` a
        0-dim tensor, and the mask hides the positions after each query (not yet written).
        ``window``: the inputs of the layers with that sliding window (their mask, the scheme's local
        rotary tables); ``rolling``: their cache keeps only the last window - 1 positions, so the keys
        start at max(0, offset - window + 1)."""
        key_start = 0
        if capacity is not None:
            if not isinstance(offset, Tensor):
                raise ValueError("a static cache's offset is a position tensor")
            k_len = capacity
            if padding_mask is not None and padding_mask.shape[1] != capacity:
                raise ValueError(f"padding_mask covers {padding_mask.shape[1]} positions but the static cache "
                                 f"holds {capacity}; pass the padding of every position of the buffer")
            mask: Tensor | None = static_attention_mask(self.mask_kind, q_len, capacity, offset, padding_mask,
                                                        prefix_lengths, window)
            is_causal = False
        else:
            if isinstance(offset, Tensor):
                raise ValueError("a tensor offset needs the static cache's capacity")
            k_len = offset + q_len
            if padding_mask is not None and padding_mask.shape[1] != k_len:
                raise ValueError(f"padding_mask covers {padding_mask.shape[1]} positions but the attention sees "
                                 f"{k_len} keys ({offset} cached + {q_len} new); with a cache pass the mask of "
                                 "every key position")
            if window is not None and rolling:
                key_start = max(0, offset - window + 1)
            kept = padding_mask[:, key_start:] if padding_mask is not None and key_start else padding_mask
            mask, is_causal = attention_mask(self.mask_kind, q_len, kept, prefix_lengths, device, key_len=k_len,
                                             window=window, key_start=key_start)
        scheme = self.positions
        if scheme is None:
            return AttentionInputs(mask, is_causal, softcap=self.softcap)
        bias = scheme.bias(q_len, k_len, offset, device)
        if bias is not None:
            bias = bias[..., key_start:] if key_start else bias
            mask, is_causal = additive(mask, is_causal, q_len, k_len - key_start, bias), False
        local = window is not None
        return AttentionInputs(mask, is_causal, scheme.rotary(positions, q_len, offset, device, dtype, local=local),
                               softcap=self.softcap)

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
        capacity = cache.capacity if static else None
        rolling = cache is not None and cache.rolls
        by_window = {window: self.attention_inputs(q_len, padding_mask, prefix_lengths, positions, offset,
                                                   hidden.device, hidden.dtype, capacity, window, rolling)
                     for window in dict.fromkeys(self.windows)}
        memory_inputs = None
        if memory is not None or (cache is not None and cache.layers and cache.layers[0].cross_keys is not None):
            memory_mask = None
            # Decoding steps after the first (and every step of a static cache) skip the check: a host
            # sync per step.
            if memory_padding_mask is not None and (static or offset > 0 or bool(memory_padding_mask.any())):
                memory_mask = (~memory_padding_mask)[:, None, None, :]
            memory_inputs = AttentionInputs(memory_mask, False, None, memory)
        new_padding = _new_padding(padding_mask, offset, q_len, static) if self.routed else None
        # the padding of these positions, and the token embeddings for word-vector routing (MoE)
        layer_inputs = {window: LayerInputs(inputs, memory_inputs, new_padding, hidden if self.routed else None)
                        for window, inputs in by_window.items()}
        if self.attention_reuse is not None:
            return self._run_reusing(hidden, layer_inputs[self.windows[0]], cache)
        carried = None
        last = self.num_layers - 1 if output_positions is not None else self.num_layers
        for i in range(last):
            index = i % len(self.layers)
            window = self.windows[index]
            hidden, carried = self.layers[index](hidden, layer_inputs[window],
                                                 cache.layer(i, window) if cache is not None else None,
                                                 carried if self.residual_attention else None)
        if output_positions is not None:
            index = last % len(self.layers)
            hidden, _ = self.layers[index](hidden, layer_inputs[self.windows[index]], keep=output_positions)
        if cache is not None:
            cache.advance(q_len)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        return hidden

    def _can_keep(self, cache: KVCache | None, memory: Tensor | None) -> bool:
        """Whether the last layer can compute only the first positions (see :meth:`run`)."""
        return (cache is None and memory is None and self.attention_reuse is None and not self.residual_attention
                and not self.routed and self.layers[-1].can_keep)

    def _run_reusing(self, hidden: Tensor, inputs: LayerInputs, cache: KVCache | None) -> Tensor:
        """The layers with attention-weight reuse: this forward's plan says which reusing layers
        recompute; a layer returns its probabilities only when the next one reuses them."""
        plan = self.attention_reuse
        if cache is not None and plan.stochastic(self.training):
            raise ValueError("attention reuse with stochastic recomputation (0 < recompute_p < 1) in training mode "
                             "cannot run with a key/value cache: a reusing layer caches no keys on the steps it "
                             "reuses; generate in eval mode (model.eval())")
        computes = plan.plan(self.reusing, self.training)
        handing = inputs.with_probabilities()
        probs = None
        for i, layer in enumerate(self.layers):
            reuse_next = i + 1 < len(self.layers) and not computes[i + 1]
            hidden, probs = layer(hidden, handing if reuse_next else inputs, cache.layer(i) if cache is not None
                                  else None, None if computes[i] else probs)
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
