"""Multi-head self-attention through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused query/key/value projection.

    ``qkv`` is one Linear(H, 3H) (one matmul instead of three); its output rows are
    [query; key; value], each split into heads of size H / num_heads.
    forward(x [B,S,H], mask [B|1,1,S|1,S] bool True = attend, is_causal) -> [B,S,H].
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        b, s, h = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, heads, S, head_size]
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0)
        return self.out(context.transpose(1, 2).reshape(b, s, h))
