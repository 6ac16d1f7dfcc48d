"""Position-wise feed-forward blocks: dense and gated (GLU variants, Shazeer 2020)."""

from __future__ import annotations

from torch import Tensor, nn

from pentad.layers.activations import get_activation


class FeedForward(nn.Module):
    """[B,S,H] -> [B,S,H] through width ``ffn_size``.

    dense: ``down(act(up(x)))`` (BERT, GPT-2, T5 v1.0).
    gated: ``down(act(gate(x)) * up(x))``: SwiGLU with ``silu`` (LLaMA), GeGLU with ``gelu`` /
    ``gelu_tanh`` (T5 v1.1). The gate has its own [ffn_size, H] weight.
    """

    def __init__(self, hidden_size: int, ffn_size: int, activation: str = "gelu", bias: bool = True,
                 gated: bool = False):
        super().__init__()
        self.gate = nn.Linear(hidden_size, ffn_size, bias=bias) if gated else None
        self.up = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.down = nn.Linear(ffn_size, hidden_size, bias=bias)
        self.act = get_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))
