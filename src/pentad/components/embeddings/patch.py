"""Image patches as a sequence (ViT): a strided convolution cuts the image into patches and
projects each to the embedding width; a learned CLS vector goes in front.

pixels [B,C,H,W] (float, normalised) -> [B, 1 + (H/p)(W/p), E]. The part defines the slot's
sequence, so a ``pos`` part beside it gets one learned position per CLS and patch (ViT's
``max_seq_length`` is 1 + the number of patches: 197 for 224-pixel images and 16-pixel patches).

``bias``: the projection's bias. Hugging Face's ViT and CLIP layouts have one (CLIP's is
``bias=False`` too); TencentPretrain's ViT has none, and its converter drops Hugging Face's bias
silently, which changes the model. pentad keeps whichever the checkpoint has.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class PatchEmbeddingConfig(StrictModel):
    type: Literal["patch"] = "patch"
    image_size: list[int] = Field([224, 224], description="image height and width in pixels (one number: "
                                  "square images); images are resized or cropped to it by the data pipeline")
    patch_size: int = Field(16, ge=1, description="side of a square patch, in pixels")
    channels: int = Field(3, ge=1, description="3 for RGB, 1 for grayscale")
    bias: bool = Field(True, description="a bias in the patch projection (Hugging Face ViT: true; "
                       "TencentPretrain: false)")
    cls: bool = Field(True, description="a learned CLS vector before the patches (what cls heads pool)")

    @field_validator("image_size", mode="before")
    @classmethod
    def _square(cls, value: Any) -> Any:
        return [value, value] if isinstance(value, int) else value

    @field_validator("image_size")
    @classmethod
    def _two(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or min(value) < 1:
            raise ValueError(f"expected one size or [height, width] of positive integers, found {value}")
        return value

    @property
    def grid(self) -> tuple[int, int]:
        """Patches along the height and the width."""
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    @property
    def length(self) -> int:
        """The sequence length this part makes: the patches, and the CLS position."""
        rows, cols = self.grid
        return rows * cols + int(self.cls)

    def check(self, model: Any) -> list[tuple[str, str]]:
        problems = []
        for side, size in zip(("height", "width"), self.image_size):
            if size % self.patch_size:
                problems.append(("image_size", f"the image {side} {size} is not a multiple of patch_size "
                                 f"{self.patch_size}; pick sizes that patches tile exactly"))
        if not problems and self.length > model.max_seq_length:
            problems.append(("image_size", f"{self.image_size[0]}x{self.image_size[1]} images in "
                             f"{self.patch_size}-pixel patches make {self.length} positions (CLS included), "
                             f"more than model.max_seq_length={model.max_seq_length}; set "
                             f"model.max_seq_length={self.length}"))
        return problems


@EMBEDDINGS.register("patch")
class PatchEmbedding(EmbeddingPart):
    """pixels [B,C,H,W] -> [B, 1+N, E]: ``proj`` (Conv2d, kernel = stride = patch) and ``cls`` [E]."""

    Config = PatchEmbeddingConfig
    requires = ("pixels",)
    defines_sequence = True

    def __init__(self, image_size: tuple[int, int], patch_size: int, channels: int, hidden_size: int,
                 bias: bool = True, cls: bool = True):
        super().__init__()
        self.image_size = tuple(image_size)
        self.patch_size = patch_size
        self.channels = channels
        self.proj = nn.Conv2d(channels, hidden_size, kernel_size=patch_size, stride=patch_size, bias=bias)
        self.cls = nn.Parameter(torch.empty(hidden_size)) if cls else None

    @classmethod
    def from_config(cls, cfg: PatchEmbeddingConfig, model) -> PatchEmbedding:
        return cls(tuple(cfg.image_size), cfg.patch_size, cfg.channels, model.hidden_size, cfg.bias, cfg.cls)

    def initialise(self, std: float) -> None:
        """ViT's initialisation (as Hugging Face's): a truncated normal projection, zero bias and CLS."""
        nn.init.trunc_normal_(self.proj.weight, std=std)
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)
        if self.cls is not None:
            nn.init.zeros_(self.cls)

    def position_grid(self) -> tuple[int, int, int]:
        rows, cols = self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size
        return int(self.cls is not None), rows, cols

    def padding_mask(self, batch: Batch, length: int) -> Tensor | None:
        """Every patch of an image is real: no padding."""
        return None

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        pixels = batch.pixels
        if pixels is None or pixels.dim() != 4 or tuple(pixels.shape[1:]) != (self.channels, *self.image_size):
            found = "none" if pixels is None else f"shape {list(pixels.shape)}"
            raise ValueError(f"the patch embedding expects pixels [batch, {self.channels}, {self.image_size[0]}, "
                             f"{self.image_size[1]}], found {found}; the data pipeline resizes images to "
                             "the part's image_size")
        patches = self.proj(pixels.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)
        if self.cls is None:
            return patches
        cls = self.cls.to(patches.dtype).expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1)
