"""Transformer layers and the config-free stack that encoders and decoders are built from."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from pentad.layers.attention import Attention, AttentionInputs
from pentad.layers.cache import KVCache, LayerCache
from pentad.layers.feed_forward import FeedForward
from pentad.layers.masks import additive, attention_mask
from pentad.layers.norms import make_norm
from pentad.layers.positions import RelativePositionBias, alibi_bias, rotary_cos_sin

PositionKind = Literal["none", "rotary", "relative", "alibi"]


class TransformerLayer(nn.Module):
    """A transformer layer, [B,S,H] -> [B,S,H]: self-attention, optional cross-attention over an
    encoder memory (decoder layers), feed-forward; each sub-layer with a residual and a norm.

    ``post`` norm (BERT, BART; Vaswani et al. 2017): x = norm(x + sublayer(x)).
    ``pre`` norm (GPT-2, T5, LLaMA; Xiong et al. 2020): x = x + sublayer(norm(x)).
    """

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, activation: str,
                 dropout: float, attention_dropout: float, norm_position: Literal["pre", "post"],
                 bias: bool, layer_norm_eps: float, *, num_kv_heads: int | None = None,
                 head_size: int | None = None, norm: str = "layernorm", gated: bool = False,
                 scale: bool = True, residual_attention: bool = False, cross_attention: bool = False):
        super().__init__()
        self.pre_norm = norm_position == "pre"
        self.attention = Attention(hidden_size, num_heads, num_kv_heads, head_size, attention_dropout, bias,
                                   scale, residual=residual_attention)
        self.attention_norm = make_norm(norm, hidden_size, layer_norm_eps)
        if cross_attention:
            self.cross_attention = Attention(hidden_size, num_heads, num_kv_heads, head_size, attention_dropout,
                                             bias, scale, cross=True)
            self.cross_attention_norm = make_norm(norm, hidden_size, layer_norm_eps)
        else:
            self.cross_attention = None
        self.ffn = FeedForward(hidden_size, ffn_size, activation, bias, gated)
        self.ffn_norm = make_norm(norm, hidden_size, layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn) -> tuple[Tensor, Tensor | None]:
        if self.pre_norm:
            out, extra = fn(norm(x))
            return x + self.dropout(out), extra
        out, extra = fn(x)
        return norm(x + self.dropout(out)), extra

    def forward(self, x: Tensor, inputs: AttentionInputs, cache: LayerCache | None = None,
                memory: Tensor | None = None, memory_inputs: AttentionInputs | None = None,
                prev_scores: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Returns (hidden, raw attention scores when residual attention is on, else None)."""
        x, scores = self._sublayer(x, self.attention_norm,
                                   lambda h: self.attention(h, inputs, cache, prev_scores=prev_scores))
        if self.cross_attention is not None:
            x, _ = self._sublayer(x, self.cross_attention_norm,
                                  lambda h: self.cross_attention(h, memory_inputs, cache, memory=memory))
        x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, scores


class TransformerStack(nn.Module):
    """``num_layers`` transformer layers with their shared inputs built once per forward.

    Owns what every layer reads: the attention mask (``mask_kind``), the in-attention position
    signal (``positions``: rotary, T5 relative bias held once in ``relative_bias``, or ALiBi), and
    an optional final norm (of the layers' kind and eps unless ``final_norm_kind`` /
    ``final_norm_eps`` say otherwise: TencentPretrain's decoder ends with its own).
    ``share_layers`` applies one layer ``num_layers`` times (ALBERT).
    """

    def __init__(self, hidden_size: int, num_layers: int, num_heads: int, ffn_size: int, *,
                 activation: str = "gelu", norm_position: Literal["pre", "post"] = "post",
                 final_norm: bool = False, mask: str = "bidirectional", dropout: float = 0.1,
                 attention_dropout: float = 0.1, bias: bool = True, layer_norm_eps: float = 1e-12,
                 num_kv_heads: int | None = None, head_size: int | None = None, norm: str = "layernorm",
                 gated: bool = False, scale: bool = True, positions: PositionKind = "none",
                 rotary_base: float = 10000.0, rotary_dim: int | None = None, relative_buckets: int = 32,
                 relative_max_distance: int = 128, share_layers: bool = False,
                 residual_attention: bool = False, cross_attention: bool = False,
                 final_norm_kind: str | None = None, final_norm_eps: float | None = None):
        super().__init__()
        self.mask_kind = mask
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_size = head_size or hidden_size // num_heads
        self.position_kind = positions
        self.rotary_base = rotary_base
        self.rotary_dim = rotary_dim or self.head_size
        self.residual_attention = residual_attention
        self.layers = nn.ModuleList(
            TransformerLayer(hidden_size, num_heads, ffn_size, activation, dropout, attention_dropout,
                             norm_position, bias, layer_norm_eps, num_kv_heads=num_kv_heads, head_size=head_size,
                             norm=norm, gated=gated, scale=scale, residual_attention=residual_attention,
                             cross_attention=cross_attention)
            for _ in range(1 if share_layers else num_layers))
        self.relative_bias = (RelativePositionBias(num_heads, relative_buckets, relative_max_distance,
                                                   bidirectional=mask == "bidirectional")
                              if positions == "relative" else None)
        self.final_norm = (make_norm(final_norm_kind or norm, hidden_size,
                                     layer_norm_eps if final_norm_eps is None else final_norm_eps)
                           if final_norm else None)

    def attention_inputs(self, q_len: int, padding_mask: Tensor | None, prefix_lengths: Tensor | None,
                         positions: Tensor | None, offset: int, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> AttentionInputs:
        """Mask, position bias and rotary tables for queries at positions offset..offset+q_len-1.
        ``dtype``: the hidden states' (rotary tables are computed in fp32 and stored in it, so that
        bf16 weights give bf16 queries and keys; under autocast the hidden states stay fp32)."""
        k_len = offset + q_len
        if padding_mask is not None and padding_mask.shape[1] != k_len:
            raise ValueError(f"padding_mask covers {padding_mask.shape[1]} positions but the attention sees "
                             f"{k_len} keys ({offset} cached + {q_len} new); with a cache pass the mask of "
                             "every key position")
        mask, is_causal = attention_mask(self.mask_kind, q_len, padding_mask, prefix_lengths, device, key_len=k_len)
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
                positions = torch.arange(offset, k_len, device=device)[None]
            rotary = rotary_cos_sin(positions, self.rotary_dim, self.rotary_base, dtype=dtype)
        return AttentionInputs(mask, is_causal, rotary)

    def run(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
            positions: Tensor | None = None, cache: KVCache | None = None, memory: Tensor | None = None,
            memory_padding_mask: Tensor | None = None) -> Tensor:
        """hidden [B,q,H] -> [B,q,H]; with ``cache`` the q new positions follow the cached ones and
        ``padding_mask`` covers all of them ([B, cached + q])."""
        offset = cache.length if cache is not None else 0
        inputs = self.attention_inputs(hidden.shape[1], padding_mask, prefix_lengths, positions, offset,
                                       hidden.device, hidden.dtype)
        memory_inputs = None
        if memory is not None or (cache is not None and cache.layers and cache.layers[0].cross_keys is not None):
            memory_mask = None
            # Decoding steps after the first (offset > 0) skip the check: a host sync per step.
            if memory_padding_mask is not None and (offset > 0 or bool(memory_padding_mask.any())):
                memory_mask = (~memory_padding_mask)[:, None, None, :]
            memory_inputs = AttentionInputs(memory_mask, False, None)
        scores = None
        for i in range(self.num_layers):
            layer = self.layers[i % len(self.layers)]
            hidden, scores = layer(hidden, inputs, cache.layer(i) if cache is not None else None, memory,
                                   memory_inputs, scores if self.residual_attention else None)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        return hidden
