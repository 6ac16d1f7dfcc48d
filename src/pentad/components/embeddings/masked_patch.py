"""Image patches with masking (BEiT, Bao et al. 2021): the patch embedding of ``patch.py``, where the
patches ``Batch.patch_mask`` marks are replaced by one learned mask vector before positions are added,
so the encoder has to predict what they hide (masked image modelling over visual tokens).

pixels [B,C,H,W] and patch_mask [B,N] bool (True = masked; absent: nothing masked, as when
fine-tuning a pre-trained BEiT) -> [B, 1+N, E]. Parameters: ``proj`` and ``cls`` as the patch
part, and ``mask`` [E] (TencentPretrain's ``mask_emb``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from pentad.components.base import Batch
from pentad.components.embeddings.patch import PatchEmbedding, PatchEmbeddingConfig
from pentad.registry import EMBEDDINGS


class MaskedPatchEmbeddingConfig(PatchEmbeddingConfig):
    type: Literal["masked_patch"] = "masked_patch"  # type: ignore[assignment]


@EMBEDDINGS.register("masked_patch")
class MaskedPatchEmbedding(PatchEmbedding):
    """pixels [B,C,H,W] (+ patch_mask [B,N]) -> [B, 1+N, E], masked patches replaced by ``mask``."""

    Config = MaskedPatchEmbeddingConfig

    def __init__(self, image_size: tuple[int, int], patch_size: int, channels: int, hidden_size: int,
                 bias: bool = True, cls: bool = True):
        super().__init__(image_size, patch_size, channels, hidden_size, bias, cls)
        self.mask = nn.Parameter(torch.empty(hidden_size))

    @classmethod
    def from_config(cls, cfg: MaskedPatchEmbeddingConfig, model) -> MaskedPatchEmbedding:  # type: ignore[override]
        return cls(tuple(cfg.image_size), cfg.patch_size, cfg.channels, model.hidden_size, cfg.bias, cfg.cls)

    def initialise(self, std: float) -> None:
        super().initialise(std)
        nn.init.trunc_normal_(self.mask, std=std)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        out = super().forward(batch, length)
        mask = batch.patch_mask
        if mask is None:
            return out
        first = 0 if self.cls is None else 1
        if tuple(mask.shape) != (out.shape[0], out.shape[1] - first):
            raise ValueError(f"patch_mask has shape {list(mask.shape)}, the image {out.shape[1] - first} patches "
                             f"per row of {out.shape[0]}")
        patches = torch.where(mask[..., None], self.mask.to(out.dtype), out[:, first:])
        return torch.cat([out[:, :first], patches], dim=1) if first else patches
