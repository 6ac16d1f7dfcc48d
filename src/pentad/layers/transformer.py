"""One transformer layer: self-attention and feed-forward, each with a residual and a norm."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from pentad.layers.attention import SelfAttention
from pentad.layers.feed_forward import FeedForward


class TransformerLayer(nn.Module):
    """A transformer layer, [B,S,H] -> [B,S,H].

    ``post`` norm (BERT, Vaswani et al. 2017): x = norm(x + sublayer(x)).
    ``pre`` norm (GPT-2, Xiong et al. 2020): x = x + sublayer(norm(x)).
    """

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, activation: str,
                 dropout: float, attention_dropout: float, norm_position: Literal["pre", "post"],
                 bias: bool, layer_norm_eps: float):
        super().__init__()
        self.pre_norm = norm_position == "pre"
        self.attention = SelfAttention(hidden_size, num_heads, attention_dropout, bias)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.ffn = FeedForward(hidden_size, ffn_size, activation, bias)
        self.ffn_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attention(self.attention_norm(x), mask, is_causal))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attention_norm(x + self.dropout(self.attention(x, mask, is_causal)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))
