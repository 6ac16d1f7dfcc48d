"""Text to image tokens (DALL-E, Ramesh et al. 2021; TencentPretrain's dall-e): objective ``dalle``.

The corpus is captioned images, as for ``clip``: a header ``text<TAB>path`` (either order) or JSON
lines ``{"text": ..., "path": ...}``, paths relative to the corpus's folder. Preprocessing decodes
each image in the worker processes (:class:`~pentad.data.objectives.vision.ImageObjective`), turns it
into the ids of its patches in an image tokenizer's codebook (``image_tokenizer``, a file ``pentad
image-tokenizer fit`` writes; :mod:`pentad.data.image_tokenizer`) and stores one sequence per image::

    [CLS] caption [SEP] image_0 ... image_{N-1}

where image token ``i`` of the codebook is id ``offset + i`` and ``offset`` is the text vocabulary's
size: the model's vocabulary is the text vocabulary followed by the codebook (TencentPretrain's
``text_image`` tokenizer layout). A caption longer than ``text_length`` tokens ([CLS] and [SEP]
included) or with text outside the vocabulary is a bad line (``data.on_bad_line``), never cut or
[UNK]; the image keeps all its tokens.

Batches are a prefix language model's: ``tokens``, ``segments`` (0 over the caption, 1 over the
image: a ``prefix`` mask lets the caption attend both ways), ``padding_mask`` and ``labels["lm"]``, the
next token wherever it is an image token (the caption itself is never scored). Generation then
continues a caption with image tokens only (:func:`pentad.generation.images.generate_images`), which
the image tokenizer paints back into pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.image_tokenizer import load_for_objective
from pentad.data.images import AugmentConfig
from pentad.data.objectives.base import new_batch, segments_from_split, to_batch_tensor
from pentad.data.objectives.vision import ImageObjective, ImageObjectiveConfig, caption_ids
from pentad.data.shards import Instances
from pentad.data.tsv import assemble_pairs
from pentad.errors import UserError
from pentad.log import info
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class DalleObjectiveConfig(ImageObjectiveConfig):
    type: Literal["dalle"] = "dalle"
    seq_length: int = Field(1024, ge=4, description="the longest sequence: caption tokens plus the image's tokens "
                            "(checked against the model's positions)")
    text_length: int = Field(64, ge=3, description="caption tokens kept, [CLS] and [SEP] included")
    image_tokenizer: Path | None = Field(None, description="the image tokenizer file (pentad image-tokenizer fit) "
                                         "whose codebook ids are the image tokens")
    augment: AugmentConfig | None = Field(None, description="unused: the image tokens are fixed at preprocess time")


@OBJECTIVES.register("dalle")
class DalleObjective(ImageObjective):
    """Captioned images -> ``[CLS] caption [SEP]`` then the image's tokens, a prefix LM over the image part."""

    Config = DalleObjectiveConfig
    column = "text"
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "segments", "padding_mask", "labels.lm"})
    corpus_format: ClassVar[str] = ("a header line 'text<TAB>path', then one captioned image per line (relative "
                                    "to the corpus's folder); or JSON lines {\"text\": ..., \"path\": ...}")
    field_names: ClassVar[tuple[str, ...]] = ("split",)
    collate_options: ClassVar[frozenset[str]] = frozenset({"normalise", "augment"})
    truncation_refused: ClassVar[str | None] = (
        "labels.lm scores the image tokens after the caption, which a shorter length would cut away")

    def __init__(self, cfg: DalleObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: DalleObjectiveConfig = cfg
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)
        self.image_tokenizer, self.grid = load_for_objective(
            cfg.image_tokenizer, "dalle", "its image tokens", self.size, cfg.channels)
        image = self.image_tokenizer
        self.image_length = self.grid[0] * self.grid[1]
        self.offset = int(tokenizer.vocab_size)  # image token i is id offset + i
        if cfg.text_length + self.image_length > cfg.seq_length:
            raise UserError(f"data.objective.seq_length {cfg.seq_length} is shorter than text_length "
                            f"{cfg.text_length} plus the image's {self.image_length} tokens "
                            f"({self.grid[0]} x {self.grid[1]} patches)")
        # the stored ids reach past the text vocabulary (the writer sizes its token dtype by this)
        self.stored_vocab_size = self.offset + image.codebook_size

    def array_specs(self) -> dict[str, dict[str, Any]]:
        return {}  # the image is kept as its tokens, not its pixels

    def instance_options(self) -> dict[str, Any]:
        options = super().instance_options()
        options.pop("image_tokenizer", None)  # the stored tokens depend on the codebook, not its file's place
        options["image_tokenizer_fingerprint"] = self.image_tokenizer.fingerprint()
        return options

    def manifest_extra(self) -> dict[str, Any]:
        image = self.image_tokenizer
        return {"image_tokenizer": {"file": str(self.cfg.image_tokenizer), "fingerprint": image.fingerprint(),
                                    "patch_size": image.patch_size, "codebook_size": image.codebook_size,
                                    "offset": self.offset, "grid": list(self.grid)}}

    def check_model(self, model: Any) -> None:
        """The model's vocabulary holds the text ids and then the codebook; its positions the sequence."""
        need = self.offset + self.image_tokenizer.codebook_size
        vocab = getattr(model, "vocab_size", None)
        if vocab != need:  # the text vocabulary decided it (runs.complete_vocab); the codebook follows it
            model.vocab_size = need
            info(f"model.vocab_size {need}: the text vocabulary's {self.offset} ids, then the image tokenizer's "
                 f"{self.image_tokenizer.codebook_size} codes")
        positions = getattr(model, "max_seq_length", None)
        if positions is not None and positions < self.cfg.seq_length:
            raise UserError(f"model.max_seq_length {positions} is shorter than data.objective.seq_length "
                            f"{self.cfg.seq_length} (the caption and the image's {self.image_length} tokens)")

    def check_value(self, value: str) -> list[int]:
        return caption_ids(self.tokenizer, value, self.cfg.text_length - 2, "data.objective.text_length")

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        kept = [item for item in items if item is not None]
        if not kept:
            return Instances.from_sequences([], split=[])
        captions, _ = assemble_pairs([ids for ids, _ in kept], None, self.cls_id, self.sep_id, self.cfg.text_length)
        images = np.stack([image for _, image in kept])
        codes = self.image_tokenizer.encode(images).astype(np.int64) + self.offset
        sequences = [np.concatenate([caption, row]) for caption, row in zip(captions, codes)]
        return Instances.from_sequences(sequences, split=[len(c) for c in captions])

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S]; labels.lm [B,S]: the next token where it is an image token."""
        from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

        ids, valid = instances.padded(self.pad_id)
        segments = segments_from_split(instances.fields["split"], valid)
        labels = np.full_like(ids, IGNORE_INDEX)
        labels[:, :-1] = np.where(segments[:, 1:] == 1, ids[:, 1:], IGNORE_INDEX)
        return new_batch(tokens=to_batch_tensor(ids), segments=to_batch_tensor(segments),
                         padding_mask=to_batch_tensor(~valid), labels={"lm": to_batch_tensor(labels)})
