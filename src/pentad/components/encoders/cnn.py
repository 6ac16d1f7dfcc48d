"""Convolutional encoders: ``gatedcnn`` (gated linear units, Dauphin et al. 2017) and ``cnn``.

``gatedcnn`` follows TencentPretrain's ``cnn_encoder.py``: a first gated convolution from the
embedding width to ``hidden_size``, then ``num_layers - 1`` gated convolutions of width
``hidden_size``, each ``conv(x) * sigmoid(gate(x))`` over a causal window of ``kernel_size``
tokens (left zero padding), with a residual connection around every ``block_size`` layers after
the first. The convolution and its gate are held as one ``Conv1d`` with ``2 * hidden_size``
outputs (first half the values, second half the gates: one product instead of two).
TencentPretrain adds a second bias after each convolution, beside the convolution's own; it is
redundant but kept (``extra_bias``) so that parameter counts and checkpoints correspond one to one:
``2 * (H*E*k + H) + 2*H`` parameters for the first layer and ``2 * (H*H*k + H) + 2*H`` for each other.

``cnn`` is a pentad addition (TencentPretrain has no such encoder): a stack of ``Conv1d`` +
activation + dropout layers, causal or centred ("same") windows, with a residual connection
around every layer whose input and output widths agree.

Padding is zeroed before every convolution, as the zeros beyond a sequence's ends are, so padding
never leaks into real positions: a row padded on either side gives the same outputs at its real
positions as its real tokens alone, whatever the padding holds. Incremental decoding (a ``cache``)
is not supported.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Encoder
from pentad.components.encoders.rnn import input_width
from pentad.config.base import StrictModel
from pentad.layers.activations import ACTIVATION_NAMES, get_activation
from pentad.layers.dropout import Dropout
from pentad.registry import ENCODERS

Activation = Literal[ACTIVATION_NAMES]  # type: ignore[valid-type]


def _no_cache(name: str, cache: Any) -> None:
    if cache is not None:
        raise ValueError(f"the '{name}' encoder does not support incremental decoding (a key/value cache); "
                         "generate without a cache or use a transformer encoder")


def _he_normal_(conv: nn.Conv1d) -> None:
    """He et al. (2015) normal initialisation over the fan-in (as Dauphin et al. 2017), zero bias."""
    fan_in = conv.in_channels * conv.kernel_size[0]
    nn.init.normal_(conv.weight, std=math.sqrt(2.0 / fan_in))
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


def _keep_mask(padding_mask: Tensor | None, like: Tensor) -> Tensor | None:
    """[B,1,S] multiplier, 0 at padding, in the dtype of ``like`` (channels-first activations)."""
    return None if padding_mask is None else (~padding_mask)[:, None, :].to(like.dtype)


# --------------------------------------------------------------------------------- gated CNN
class GatedCnnEncoderConfig(StrictModel):
    type: Literal["gatedcnn"] = "gatedcnn"
    num_layers: int = Field(9, ge=1, description="gated convolution layers, the first included")
    kernel_size: int = Field(4, ge=1, description="tokens in each causal window")
    block_size: int = Field(2, ge=1, description="a residual connection around every block_size layers "
                                                 "after the first")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="after each layer (TencentPretrain: none)")


class GatedConv(nn.Module):
    """One causal gated convolution: [B,Cin,S] -> [B,Cout,S], ``(W*x + b + c) * sigmoid(V*x + d + e)``.

    ``conv`` holds values and gates (2*Cout outputs); ``extra_bias`` [2*Cout] is TencentPretrain's
    second bias (see the module docstring).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(in_channels, 2 * out_channels, kernel_size)
        self.extra_bias = nn.Parameter(torch.zeros(2 * out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _he_normal_(self.conv)
        nn.init.zeros_(self.extra_bias)

    def forward(self, x: Tensor) -> Tensor:
        # Left padding of k-1 zeros: the output at t sees inputs t-k+1 .. t only.
        out = self.conv(F.pad(x, (self.kernel_size - 1, 0))) + self.extra_bias[:, None]
        return F.glu(out, dim=1)


@ENCODERS.register("gatedcnn")
class GatedCnnEncoder(Encoder):
    """Causal gated CNN (Dauphin et al. 2017): [B,S,E] -> [B,S,H]. Parameters ``layers.{i}.conv.*``
    and ``layers.{i}.extra_bias``; the output at t depends on inputs <= t only."""

    Config = GatedCnnEncoderConfig
    takes_embedding_width: ClassVar[bool] = True  # see rnn.input_width

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 9, kernel_size: int = 4,
                 block_size: int = 2, dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.layers = nn.ModuleList(
            GatedConv(input_size if i == 0 else hidden_size, hidden_size, kernel_size) for i in range(num_layers))
        self.dropout = Dropout(dropout)

    @classmethod
    def from_config(cls, cfg: GatedCnnEncoderConfig, model: Any) -> GatedCnnEncoder:
        return cls(input_width(model), model.hidden_size, cfg.num_layers, cfg.kernel_size, cfg.block_size,
                   cfg.dropout)

    def reset_parameters(self) -> None:
        for layer in self.layers:
            layer.reset_parameters()

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: Any = None) -> Tensor:
        """hidden [B,S,E], padding_mask [B,S] (True = padding) or None -> [B,S,H]; padding outputs 0.

        ``prefix_lengths`` and ``positions`` are ignored.
        """
        _no_cache(self.registry_name, cache)
        x = hidden.transpose(1, 2)  # [B,E,S]: convolutions run over the last axis
        keep = _keep_mask(padding_mask, x)
        if keep is not None:
            x = x * keep
        residual = None
        for i, layer in enumerate(self.layers):
            x = self.dropout(layer(x))
            if keep is not None:
                x = x * keep
            if i == 0:
                residual = x
            elif i % self.block_size == 0:
                # Layers 1..block_size form the first block, and so on (TencentPretrain's grouping).
                x = x + residual
                residual = x
        return x.transpose(1, 2)


# ------------------------------------------------------------------------------- plain CNN
class CnnEncoderConfig(StrictModel):
    type: Literal["cnn"] = "cnn"
    num_layers: int = Field(2, ge=1)
    kernel_size: int = Field(3, ge=1, description="tokens in each window")
    padding: Literal["causal", "same"] = Field(
        "same", description="causal: window t-k+1..t (for LMs); same: window centred on t")
    activation: Activation = "relu"
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="after each layer")
    residual: bool = Field(True, description="add each layer's input where the widths agree")


@ENCODERS.register("cnn")
class CnnEncoder(Encoder):
    """A plain convolution stack (a pentad addition): [B,S,E] -> [B,S,H].

    Each layer is ``dropout(activation(conv(x)))`` (+ x when ``residual`` and the widths agree);
    parameters ``layers.{i}.weight`` / ``.bias``. With ``padding: causal`` the output at t depends
    on inputs <= t only.
    """

    Config = CnnEncoderConfig
    takes_embedding_width: ClassVar[bool] = True  # see rnn.input_width

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 2, kernel_size: int = 3,
                 padding: Literal["causal", "same"] = "same", activation: str = "relu", dropout: float = 0.1,
                 residual: bool = True):
        super().__init__()
        self.padding = (kernel_size - 1, 0) if padding == "causal" else ((kernel_size - 1) // 2, kernel_size // 2)
        self.activation = get_activation(activation)
        self.residual = residual
        self.layers = nn.ModuleList(
            nn.Conv1d(input_size if i == 0 else hidden_size, hidden_size, kernel_size) for i in range(num_layers))
        self.dropout = Dropout(dropout)
        self.reset_parameters()

    @classmethod
    def from_config(cls, cfg: CnnEncoderConfig, model: Any) -> CnnEncoder:
        return cls(input_width(model), model.hidden_size, cfg.num_layers, cfg.kernel_size, cfg.padding,
                   cfg.activation, cfg.dropout, cfg.residual)

    def reset_parameters(self) -> None:
        for conv in self.layers:
            _he_normal_(conv)

    def forward(self, hidden: Tensor, padding_mask: Tensor | None, prefix_lengths: Tensor | None = None,
                positions: Tensor | None = None, cache: Any = None) -> Tensor:
        """hidden [B,S,E], padding_mask [B,S] (True = padding) or None -> [B,S,H]; padding outputs 0.

        ``prefix_lengths`` and ``positions`` are ignored.
        """
        _no_cache(self.registry_name, cache)
        x = hidden.transpose(1, 2)  # [B,E,S]
        keep = _keep_mask(padding_mask, x)
        if keep is not None:
            x = x * keep
        for conv in self.layers:
            out = self.dropout(self.activation(conv(F.pad(x, self.padding))))
            if self.residual and out.shape[1] == x.shape[1]:
                out = out + x
            # Zero the padding again: the next (centred) window must see zeros there, as at the edge.
            x = out * keep if keep is not None else out
        return x.transpose(1, 2)
