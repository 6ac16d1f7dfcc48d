"""Position-wise feed-forward blocks."""

from __future__ import annotations

from torch import Tensor, nn

from pentad.layers.activations import get_activation


class FeedForward(nn.Module):
    """Dense feed-forward: ``down(act(up(x)))``; [B,S,H] -> [B,S,H] through width ``ffn_size``."""

    def __init__(self, hidden_size: int, ffn_size: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.up = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.down = nn.Linear(ffn_size, hidden_size, bias=bias)
        self.act = get_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))
