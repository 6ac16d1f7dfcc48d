"""Transformer encoder: a stack of ``TransformerLayer``s with a configurable attention mask."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Encoder
from pentad.config.base import StrictModel
from pentad.layers.activations import ACTIVATION_NAMES
from pentad.layers.masks import attention_mask
from pentad.layers.transformer import TransformerLayer
from pentad.registry import ENCODERS

Activation = Literal[ACTIVATION_NAMES]  # type: ignore[valid-type]


class TransformerEncoderConfig(StrictModel):
    type: Literal["transformer"] = "transformer"
    num_layers: int = Field(12, ge=1)
    num_heads: int = Field(12, ge=1)
    ffn_size: int | None = Field(None, ge=1, description="feed-forward width; default 4 * hidden_size")
    activation: Activation = "gelu"
    norm_position: Literal["post", "pre"] = "post"
    final_norm: bool | None = Field(None, description="norm after the last layer; default: True for pre-norm")
    mask: Literal["bidirectional", "causal", "prefix"] = "bidirectional"
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attention_dropout: float | None = Field(None, ge=0.0, lt=1.0, description="default: dropout")
    bias: bool = True
    layer_norm_eps: float = Field(1e-12, gt=0.0)

    def check(self, model) -> list[tuple[str, str]]:
        """Problems that need the model-level sizes: (sub-path, message)."""
        if model.hidden_size % self.num_heads:
            return [("num_heads", f"hidden_size {model.hidden_size} is not divisible by num_heads "
                                  f"{self.num_heads} (each head gets hidden_size / num_heads dimensions)")]
        return []


@ENCODERS.register("transformer")
class TransformerEncoder(Encoder):
    """[B,S,H] -> [B,S,H]. The mask is built once per batch and shared by every layer."""

    Config = TransformerEncoderConfig

    def __init__(self, hidden_size: int, num_layers: int, num_heads: int, ffn_size: int,
                 activation: str = "gelu", norm_position: Literal["pre", "post"] = "post",
                 final_norm: bool = False, mask: str = "bidirectional", dropout: float = 0.1,
                 attention_dropout: float = 0.1, bias: bool = True, layer_norm_eps: float = 1e-12):
        super().__init__()
        self.mask_kind = mask
        self.layers = nn.ModuleList(
            TransformerLayer(hidden_size, num_heads, ffn_size, activation, dropout, attention_dropout,
                             norm_position, bias, layer_norm_eps)
            for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if final_norm else None

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("segments",) if self.mask_kind == "prefix" else ()

    @classmethod
    def from_config(cls, cfg: TransformerEncoderConfig, model) -> TransformerEncoder:
        final_norm = cfg.final_norm if cfg.final_norm is not None else cfg.norm_position == "pre"
        return cls(model.hidden_size, cfg.num_layers, cfg.num_heads, cfg.ffn_size or 4 * model.hidden_size,
                   cfg.activation, cfg.norm_position, final_norm, cfg.mask, cfg.dropout,
                   cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout, cfg.bias,
                   cfg.layer_norm_eps)

    def forward(self, hidden: Tensor, padding_mask: Tensor | None,
                prefix_lengths: Tensor | None = None) -> Tensor:
        mask, is_causal = attention_mask(self.mask_kind, hidden.shape[1], padding_mask, prefix_lengths,
                                         device=hidden.device)
        for layer in self.layers:
            hidden = layer(hidden, mask, is_causal)
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        return hidden
