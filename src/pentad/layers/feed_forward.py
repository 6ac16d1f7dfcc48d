"""Position-wise feed-forward blocks: dense and gated (GLU variants, Shazeer 2020)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pentad.layers.activations import get_activation, get_in_place_activation
from pentad.layers.block import Block, InitScheme, init_linear


class FeedForward(Block):
    """[B,S,H] -> [B,S,H] through width ``ffn_size``.

    dense: ``down(act(up(x)))`` (BERT, GPT-2, T5 v1.0).
    gated: ``down(act(gate(x)) * up(x))``: SwiGLU with ``silu`` (LLaMA), GeGLU with ``gelu`` /
    ``gelu_tanh`` (T5 v1.1). The gate has its own [ffn_size, H] weight.

    Outside autograd (eval under ``no_grad`` or ``inference_mode``) the activation, and the gate's
    product, overwrite the projection's fresh output instead of allocating another [B,S,ffn_size]
    tensor: the same values, bit for bit, with one large allocation less per layer (on CPU each one
    is page-faulted in afresh).
    """

    def __init__(self, hidden_size: int, ffn_size: int, activation: str = "gelu", bias: bool = True,
                 gated: bool = False):
        super().__init__()
        self.gate = nn.Linear(hidden_size, ffn_size, bias=bias) if gated else None
        self.up = nn.Linear(hidden_size, ffn_size, bias=bias)
        self.down = nn.Linear(ffn_size, hidden_size, bias=bias)
        self.act = get_activation(activation)
        self.act_in_place = get_in_place_activation(activation)

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:
        """``normal``: N(0, std) weights, zero biases; ``t5``: N(0, H^-1/2) into the width and
        N(0, ffn_size^-1/2) out of it (fan-in scaled, Mesh TensorFlow)."""
        linears = (self.gate, self.up, self.down)
        if scheme == "normal":
            for linear in linears:
                init_linear(linear, std)
            return
        hidden = self.up.weight.shape[1]
        for linear in (self.up, self.gate):
            if linear is not None:
                nn.init.normal_(linear.weight, std=hidden ** -0.5)
        nn.init.normal_(self.down.weight, std=self.down.weight.shape[1] ** -0.5)
        for linear in linears:
            if linear is not None and linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def roles(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Projection name -> {role: (first row, end row)} (the :class:`Block` contract): each projection is
        one role of its own name, ``gate`` (gated only), ``up`` and ``down``."""
        return {name: {name: (0, linear.out_features)} for name in ("gate", "up", "down")
                if (linear := getattr(self, name)) is not None}

    def forward(self, x: Tensor) -> Tensor:
        if self.act_in_place is not None and not torch.is_grad_enabled():
            if self.gate is not None:
                return self.down(self.act_in_place(self.gate(x)).mul_(self.up(x)))
            return self.down(self.act_in_place(self.up(x)))
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))
