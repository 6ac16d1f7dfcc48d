"""Speech features as a sequence (speech-to-text, Wang et al. 2020; TencentPretrain's S2T; Whisper's
stem): a stack of strided 1-D convolutions over the frames subsamples them (stride 2 per layer by
default; Whisper: strides 1 then 2) and maps the feature width to the embedding width, each
convolution followed by a GLU (which halves its channels) or a GELU.

audio [B,T,F] with audio_padding_mask [B,T] -> [B,T',E] and its padding mask, where each layer maps a
length L to floor((L + 2*(k//2) - k) / s) + 1 for kernel size k and stride s: right for any number
of layers (TencentPretrain's own length formula assumes two). ``scale`` multiplies by sqrt(E), as TencentPretrain
does when sinusoidal positions are added. Parameters: ``convs.<i>.weight`` / ``.bias``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class SpeechEmbeddingConfig(StrictModel):
    type: Literal["speech"] = "speech"
    feature_size: int = Field(80, ge=1, description="features per frame (80 log-mel filterbanks)")
    conv_channels: list[int] = Field([1024, 512], min_length=1, description="output channels of each convolution "
                                     "(before the GLU halves them)")
    kernel_sizes: list[int] = Field([5, 5], min_length=1, description="kernel size of each convolution")
    strides: list[int] | None = Field(None, description="stride of each convolution; default 2 for every one "
                                      "(S2T); Whisper: [1, 2]")
    activation: Literal["glu", "gelu"] = Field("glu", description="after each convolution: glu (S2T; halves the "
                                                "channels) or gelu")
    scale: bool = Field(True, description="multiply by sqrt(width) (TencentPretrain with sinusoidal positions)")

    def check(self, model) -> list[tuple[str, str]]:
        problems = []
        if len(self.conv_channels) != len(self.kernel_sizes):
            problems.append(("kernel_sizes", f"{len(self.kernel_sizes)} kernel sizes for {len(self.conv_channels)} "
                             "convolutions (conv_channels); give one per convolution"))
        if self.activation == "glu" and any(c % 2 for c in self.conv_channels):
            problems.append(("conv_channels", f"{self.conv_channels}: a GLU halves its input, so every channel count "
                             "must be even"))
        out = self.conv_channels[-1] // (2 if self.activation == "glu" else 1)
        width = getattr(model, "embedding_size", None) or model.hidden_size
        if out != width:
            problems.append(("conv_channels", f"the last convolution gives {out} channels"
                             f"{' after its GLU' if self.activation == 'glu' else ''}, the embedding width is "
                             f"{width}; make them equal"))
        return problems


def subsampled_lengths(lengths: Tensor, kernel_sizes: list[int], strides: list[int] | None = None) -> Tensor:
    """Frame counts after each convolution (kernel k, stride s: 2 by default) with padding k//2."""
    for k, s in zip(kernel_sizes, strides or [2] * len(kernel_sizes)):
        lengths = torch.div(lengths + 2 * (k // 2) - k, s, rounding_mode="floor") + 1
    return lengths


@EMBEDDINGS.register("speech")
class SpeechEmbedding(EmbeddingPart):
    """audio [B,T,F] -> [B,T',E]: strided Conv1d layers, each followed by GLU or GELU."""

    Config = SpeechEmbeddingConfig
    requires = ("audio",)
    defines_sequence = True

    def __init__(self, feature_size: int, conv_channels: list[int], kernel_sizes: list[int], width: int,
                 activation: str = "glu", scale: bool = True, strides: list[int] | None = None):
        super().__init__()
        self.kernel_sizes = list(kernel_sizes)
        self.strides = list(strides) if strides is not None else [2] * len(self.kernel_sizes)
        self.activation = activation
        self.scale = math.sqrt(width) if scale else None
        shrink = 2 if activation == "glu" else 1
        ins = [feature_size] + [c // shrink for c in conv_channels[:-1]]
        self.convs = nn.ModuleList(nn.Conv1d(i, o, k, stride=s, padding=k // 2)
                                   for i, o, k, s in zip(ins, conv_channels, kernel_sizes, self.strides))

    @classmethod
    def from_config(cls, cfg: SpeechEmbeddingConfig, model) -> SpeechEmbedding:
        return cls(cfg.feature_size, cfg.conv_channels, cfg.kernel_sizes, model.hidden_size, cfg.activation,
                   cfg.scale, cfg.strides)

    def initialise(self, std: float) -> None:
        """Kaiming-normal kernels (as TencentPretrain and fairseq's S2T), zero biases."""
        for conv in self.convs:
            nn.init.kaiming_normal_(conv.weight)
            nn.init.zeros_(conv.bias)

    def padding_mask(self, batch: Batch, length: int) -> Tensor | None:
        mask = batch.audio_padding_mask
        if mask is None:
            return None
        lengths = subsampled_lengths((~mask).sum(dim=1), self.kernel_sizes, self.strides)
        return torch.arange(length, device=mask.device)[None, :] >= lengths[:, None]

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        audio = batch.audio
        if audio is None or audio.dim() != 3 or audio.shape[-1] != self.convs[0].in_channels:
            found = "none" if audio is None else f"shape {list(audio.shape)}"
            raise ValueError(f"the speech embedding expects audio features [batch, frames, "
                             f"{self.convs[0].in_channels}], found {found}")
        hidden = audio.to(self.convs[0].weight.dtype)
        if batch.audio_padding_mask is not None:  # padding frames read as zeros, whatever they hold
            hidden = hidden.masked_fill(batch.audio_padding_mask[..., None], 0.0)
        hidden = hidden.transpose(1, 2)
        for conv in self.convs:
            hidden = conv(hidden)
            hidden = nn.functional.glu(hidden, dim=1) if self.activation == "glu" else nn.functional.gelu(hidden)
        hidden = hidden.transpose(1, 2)
        return hidden * self.scale if self.scale is not None else hidden
