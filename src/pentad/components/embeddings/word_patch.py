"""Text and image in one sequence (ViLT, Kim et al. 2021): the word vectors of ``tokens`` followed by
an image's CLS and patch vectors, for a single-stream transformer over both modalities.

tokens [B,S] and pixels [B,C,H,W] -> [B, S + 1 + N, E]; the padding mask is the text's, then no
padding over the image. Two layouts:

* TencentPretrain's (the default): a ``pos`` part beside it numbers the whole sequence; a ``seg``
  part reads ``Batch.segments`` over the whole sequence too (the data gives the text segment 0 and
  the image segment 1, which tells the modalities apart as ViLT's modality-type embedding does).
  Parameters read ``embedding.word_patch.word.weight`` (what an mlm head ties to) and
  ``embedding.word_patch.patch.proj.*`` / ``.patch.cls``, TencentPretrain's WordPatchEmbedding layout.
* The paper's, as Hugging Face's ``ViltModel`` has it: the caption gets its own position table
  (``text_positions`` rows, ``text_pos.weight``), a token-type table whose row 0 every caption token
  adds (``text_segments`` rows, ``text_seg.weight``; HF passes token type 0) and a LayerNorm over the
  caption alone (``text_norm``); the image its own position table over its CLS and patches
  (``image_positions``, ``image_pos.weight``). A ``seg`` part beside it (no ``pos`` part, the slot's
  norm off) then plays the modality-type embedding, added after the caption's norm.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, EmbeddingPart
from pentad.components.embeddings.patch import PatchEmbedding, PatchEmbeddingConfig
from pentad.components.embeddings.pos import PosEmbedding
from pentad.components.embeddings.seg import SegEmbedding
from pentad.components.embeddings.word import WordEmbedding
from pentad.config.base import StrictModel
from pentad.registry import EMBEDDINGS

# Parts that number the slot's whole sequence: with its own text and image positions a word_patch
# part needs none of them.
SEQUENCE_POSITIONS = ("pos", "sinusoidal")


class WordPatchEmbeddingConfig(StrictModel):
    type: Literal["word_patch"] = "word_patch"
    patch: PatchEmbeddingConfig = Field(default_factory=PatchEmbeddingConfig,
                                        description="the image part (image_size, patch_size, channels, bias, cls)")
    text_positions: int | None = Field(None, ge=1, description="a learned position table of this many rows over "
                                       "the caption alone (Hugging Face ViLT's max_position_embeddings; needs "
                                       "image_positions); null: a pos part numbers the whole sequence")
    text_segments: int | None = Field(None, ge=1, description="a token-type table of this many rows whose row 0 "
                                      "every caption token adds (Hugging Face ViLT's type_vocab_size); null: none")
    text_norm: bool = Field(False, description="a LayerNorm over the caption's vectors before the image is "
                            "appended (Hugging Face ViLT); the slot's own norm must then be off")
    image_positions: bool = Field(False, description="a learned position table over the image's CLS and patches "
                                  "(Hugging Face ViLT; needs text_positions)")
    layer_norm_eps: float = Field(1e-12, gt=0.0, description="epsilon of text_norm")

    @property
    def own_positions(self) -> bool:
        """The caption and the image are numbered by this part (Hugging Face's layout)."""
        return self.text_positions is not None or self.image_positions

    def check(self, model: Any) -> list[tuple[str, str]]:
        problems = [(f"patch.{key}", msg) for key, msg in self.patch.check(model)]
        if self.text_positions is not None and not self.image_positions:
            problems.append(("image_positions", "off while text_positions numbers the caption: the image would "
                             "have no positions; set image_positions: true (or drop text_positions and number the "
                             "whole sequence with a pos part)"))
        if self.image_positions and self.text_positions is None:
            problems.append(("text_positions", "not set while image_positions numbers the image: the caption "
                             "would have no positions; set text_positions: N (Hugging Face ViLT: 40)"))
        slot = _slot_of(self, model)
        if slot is None:
            return problems
        if self.own_positions:
            numbered = [p.type for p in slot.parts if p.type in SEQUENCE_POSITIONS]
            if numbered:
                key = "text_positions" if self.text_positions is not None else "image_positions"
                problems.append((key, f"the slot also has a '{numbered[0]}' part: the caption and the image "
                                 "would be numbered twice; remove that part (or these options)"))
        if self.text_norm and slot.norm:
            problems.append(("text_norm", "on while the embedding slot's norm is on too: the caption would be "
                             "normalised twice; set the slot's norm: false (Hugging Face ViLT normalises the "
                             "caption only)"))
        return problems


def _slot_of(part: WordPatchEmbeddingConfig, model: Any) -> Any:
    """The embedding slot config whose parts hold ``part`` (None: not found, e.g. a stream's sizes)."""
    for name in ("embedding", "target_embedding"):
        slot = getattr(model, name, None)
        if slot is not None and any(p is part for p in slot.parts):
            return slot
    return None


@EMBEDDINGS.register("word_patch")
class WordPatchEmbedding(EmbeddingPart):
    """tokens [B,S] + pixels [B,C,H,W] -> [B, S+1+N, E]: ``word`` then ``patch``, each with its own
    positions (and the caption a token type and a norm) when configured so."""

    Config = WordPatchEmbeddingConfig
    requires = ("tokens", "pixels")
    defines_sequence = True
    word_table = "word.weight"

    def __init__(self, word: WordEmbedding, patch: PatchEmbedding, text_positions: int | None = None,
                 text_segments: int | None = None, text_norm: bool = False, image_positions: int | None = None,
                 layer_norm_eps: float = 1e-12):
        """``image_positions``: rows of the image's position table (its CLS and patches), None: none."""
        super().__init__()
        hidden = word.weight.shape[1]
        self.word = word
        self.patch = patch
        self.text_pos = PosEmbedding(text_positions, hidden) if text_positions else None
        self.text_seg = SegEmbedding(text_segments, hidden) if text_segments else None
        self.text_norm = nn.LayerNorm(hidden, eps=layer_norm_eps) if text_norm else None
        self.image_pos = PosEmbedding(image_positions, hidden) if image_positions else None

    @classmethod
    def from_config(cls, cfg: WordPatchEmbeddingConfig, model) -> WordPatchEmbedding:
        return cls(WordEmbedding(model.vocab_size, model.hidden_size), PatchEmbedding.from_config(cfg.patch, model),
                   cfg.text_positions, cfg.text_segments, cfg.text_norm,
                   cfg.patch.length if cfg.image_positions else None, cfg.layer_norm_eps)

    def initialise(self, std: float) -> None:
        self.word.initialise(std)
        self.patch.initialise(std)
        for table in (self.text_pos, self.text_seg, self.image_pos):
            if table is not None:
                table.initialise(std)
        if self.text_norm is not None:
            self.text_norm.reset_parameters()

    def padding_mask(self, batch: Batch, length: int) -> Tensor | None:
        text = batch.padding_mask
        if text is None:
            return None
        image = torch.zeros(text.shape[0], length - text.shape[1], dtype=torch.bool, device=text.device)
        return torch.cat([text, image], dim=1)

    def forward(self, batch: Batch, length: int | None = None) -> Tensor:
        text = self.word(batch)
        if self.text_seg is not None:
            text = text + self.text_seg.weight[0]
        if self.text_pos is not None:
            rows = self.text_pos.weight.shape[0]
            if text.shape[1] > rows:
                raise ValueError(f"a caption of {text.shape[1]} tokens exceeds the word_patch part's {rows} text "
                                 "positions (text_positions); shorten the captions")
            text = text + self.text_pos.weight[:text.shape[1]]
        if self.text_norm is not None:
            text = self.text_norm(text)
        image = self.patch(batch)
        if self.image_pos is not None:
            image = image + self.image_pos.weight.to(image.dtype)
        return torch.cat([text, image], dim=1)
