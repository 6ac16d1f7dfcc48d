"""Text and image in one sequence (ViLT, Kim et al. 2021): the word vectors of ``tokens`` followed by
an image's CLS and patch vectors, for a single-stream transformer over both modalities.

tokens [B,S] and pixels [B,C,H,W] -> [B, S + 1 + N, E]; the padding mask is the text's, then no
padding over the image. A ``pos`` part beside it numbers the whole sequence; a ``seg`` part reads
``Batch.segments`` over the whole sequence too (the data gives the text segment 0 and the image
segment 1, which tells the modalities apart as ViLT's modality-type embedding does). Parameters
read ``embedding.word_patch.word.weight`` (what an mlm head ties to) and
``embedding.word_patch.patch.proj.*`` / ``.patch.cls``, TencentPretrain's WordPatchEmbedding layout.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, EmbeddingPart
from pentad.components.embeddings.patch import PatchEmbedding, PatchEmbeddingConfig
from pentad.components.embeddings.word import WordEmbedding
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS


class WordPatchEmbeddingConfig(StrictModel):
    type: Literal["word_patch"] = "word_patch"
    patch: PatchEmbeddingConfig = Field(default_factory=PatchEmbeddingConfig,
                                        description="the image part (image_size, patch_size, channels, bias, cls)")

    def check(self, model) -> list[tuple[str, str]]:
        return [(f"patch.{key}", msg) for key, msg in self.patch.check(model)]


@EMBEDDINGS.register("word_patch")
class WordPatchEmbedding(EmbeddingPart):
    """tokens [B,S] + pixels [B,C,H,W] -> [B, S+1+N, E]: ``word`` then ``patch``."""

    Config = WordPatchEmbeddingConfig
    requires = ("tokens", "pixels")
    defines_sequence = True
    word_table = "word.weight"

    def __init__(self, word: WordEmbedding, patch: PatchEmbedding):
        super().__init__()
        self.word = word
        self.patch = patch

    @classmethod
    def from_config(cls, cfg: WordPatchEmbeddingConfig, model) -> WordPatchEmbedding:
        return cls(WordEmbedding(model.vocab_size, model.hidden_size), PatchEmbedding.from_config(cfg.patch, model))

    def initialise(self, std: float) -> None:
        self.word.initialise(std)
        self.patch.initialise(std)

    def padding_mask(self, batch: Batch, length: int) -> Tensor | None:
        text = batch.padding_mask
        if text is None:
            return None
        image = torch.zeros(text.shape[0], length - text.shape[1], dtype=torch.bool, device=text.device)
        return torch.cat([text, image], dim=1)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        return torch.cat([self.word(batch), self.patch(batch)], dim=1)
