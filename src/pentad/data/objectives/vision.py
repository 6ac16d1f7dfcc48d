"""Image objectives for ``pentad preprocess`` / ``pentad pretrain``: ``vit`` (label + image),
``clip`` (text + image, two streams) and ``vilt`` (text + image in one sequence).

The corpus has a header line naming its two columns (``label<TAB>path`` for ``vit``,
``text<TAB>path`` for ``clip``, in either order), or is JSON lines with the same two keys (the first
line starting with ``{`` says which); image paths are relative to the corpus file's folder, or
absolute. Preprocessing decodes each image in the worker processes (Pillow; converted to the
objective's channels, resized bicubically to ``image_size``: :func:`pentad.data.images.decode_image`)
and stores it as a typed uint8 array beside the instance's tokens (``vit``: none, its label in the
manifest's label map; ``clip``: ``[CLS] text [SEP]``), ``image_size[0]`` rows of ``[width, channels]``
per image. Training batches are memory-mapped images, seeded augmentation (``augment``: random resized
crop, random affine and flip, from the batch's generator, so a resumed run sees the same crops) and normalisation
(``normalise``) to ``pixels [B, C, H, W]``. A missing or undecodable image is a bad line
(``data.on_bad_line``), and so is a caption with text outside the vocabulary or longer than
``seq_length`` (checked before its image is decoded): captions are never silently cut or [UNK], as
``s2t`` transcripts are not.

Batches: ``vit``: ``pixels`` and ``labels["cls"]``; ``clip``: the text's ``tokens``, ``segments`` and
``padding_mask`` with the image in ``pair.pixels`` (the two-tower model's second stream); ``vilt``:
the caption's ``tokens`` (masked for ``labels["mlm"]``) and ``pixels``, where ``negative_prob`` of the
rows show another row's image of the batch (drawn from the batch's generator: ``labels["sp"]`` 1 for
a mismatch, 0 for the caption's own image), segments 0 over the caption and 1 over the image's
``1 + (H/patch_size)(W/patch_size)`` positions, which the mlm labels cover too (ignored).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.data.corpus import BadLine
from pentad.data.images import NORMALISE, AugmentConfig, augment, decode_image, to_pixels
from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor
from pentad.data.shards import Instances, Ragged
from pentad.data.tsv import assemble_pairs, text_problem
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class ImageObjectiveConfig(ObjectiveConfig):
    """Options of the image objectives."""

    image_size: list[int] = Field([224, 224], description="[height, width] the images are stored at (the patch "
                                  "part's image_size)")
    channels: Literal[1, 3] = Field(3, description="3 (RGB) or 1 (grayscale): images are converted")
    normalise: Literal["half", "imagenet", "clip"] = Field("half", description="pixel mean and std: half (0.5: "
                                                           "Hugging Face ViT), imagenet, clip")
    augment: AugmentConfig | None = Field(default_factory=AugmentConfig, description="training augmentation; "
                                          "null: none")

    @field_validator("image_size", mode="before")
    @classmethod
    def _pair(cls, value: Any) -> Any:
        return [value, value] if isinstance(value, int) else value

    @field_validator("image_size")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or min(value) < 1:
            raise ValueError(f"expected [height, width] of positive sizes, found {value}")
        return value


def caption_ids(tokenizer: Any, caption: str, budget: int, length_key: str) -> list[int]:
    """A caption's token ids; BadLine for text outside the vocabulary or more than ``budget`` tokens
    (:func:`~pentad.data.tsv.text_problem`: refused as s2t refuses transcripts, never cut or [UNK])."""
    ids = tokenizer.encode(caption)
    problem = text_problem(tokenizer, caption, ids, budget, "caption", length_key)
    if problem is not None:
        raise BadLine(problem)
    return ids


class ImageObjective(Objective):
    """Shared by ``vit``, ``clip`` and ``beit``: the corpus (two columns, or ``path`` alone), decoding into a
    typed array, pixels."""

    column: ClassVar[str | None] = "label"  # the column beside ``path`` (None: ``path`` alone, beit)
    collate_options: ClassVar[frozenset[str]] = frozenset({"normalise", "augment"})
    truncation_refused: ClassVar[str | None] = "its input is an image, which a sequence length does not cut"
    chunk_lines: ClassVar[int | None] = 256  # a line is an image to decode (about 38 MB a chunk at 224x224 RGB)

    def __init__(self, cfg: ImageObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: ImageObjectiveConfig = cfg
        self.size = (int(cfg.image_size[0]), int(cfg.image_size[1]))
        self.mean, self.std = NORMALISE[cfg.normalise]
        # data.max_image_pixels, which preprocess_from_config sets (a data-section setting, not the objective's)
        self.max_pixels = DEFAULT_MAX_IMAGE_PIXELS
        self.converted: Counter[str] = Counter()  # since the last take_notes: mode converted from -> images

    def array_specs(self) -> dict[str, dict[str, Any]]:
        return {"image": {"dtype": "|u1", "shape": [self.size[1], self.cfg.channels]}}

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        if first_line.lstrip().startswith("{"):
            return (path.resolve().parent, None), False
        names = [c.strip().lower() for c in first_line.rstrip("\r\n").split("\t")]
        wanted = ("path",) if self.column is None else (self.column, "path")
        if sorted(names) != sorted(wanted):
            example = "path" if self.column is None else f"{self.column}<TAB>path"
            named = "the column path" if self.column is None else f"the columns {self.column} and path"
            raise UserError(f"{path}, line 1: expected a header naming {named} (e.g. '{example}'), found "
                            f"{first_line.strip()[:80]!r}")
        return (path.resolve().parent, names.index(self.column) if self.column is not None else -1), True

    def parse_line(self, text: str, context: Any) -> tuple[str | None, np.ndarray] | None:
        """(the other column's value (None without one; see :meth:`check_value`), the decoded image),
        None for a blank line."""
        if not text.strip():
            return None
        folder, column = context
        value: str | None = None
        if column is None:
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise BadLine(f"is not valid JSON ({error.msg} at column {error.colno})") from None
            keys = ("path",) if self.column is None else (self.column, "path")
            if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in keys):
                raise BadLine("is not a JSON object with the string 'path'" if self.column is None else
                              f"is not a JSON object with the strings '{self.column}' and 'path'")
            image_path = record["path"].strip()
            if self.column is not None:
                value = record[self.column].strip()
        elif column < 0:
            fields = text.rstrip("\r\n").split("\t")
            if len(fields) != 1:
                raise BadLine(f"has {len(fields)} tab-separated fields; expected 1 (path)")
            image_path = fields[0].strip()
        else:
            fields = text.rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise BadLine(f"has {len(fields)} tab-separated field(s); expected 2 ({self.column} and path)")
            value, image_path = fields[column].strip(), fields[1 - column].strip()
        if self.column is not None and not value:
            raise BadLine(f"has an empty {self.column}")
        if not image_path:
            raise BadLine("has an empty image path")
        if value is not None:
            value = self.check_value(value)  # before the image is decoded: a bad caption costs no decoding
        path = Path(image_path) if Path(image_path).is_absolute() else folder / image_path
        try:
            image, converted = decode_image(path, f"names the image {path}, which", self.size, self.cfg.channels,
                                            self.max_pixels)
        except UserError as error:
            raise BadLine(str(error)) from None
        if converted is not None:
            self.converted[converted] += 1
        return value, image

    def take_notes(self) -> dict[str, int]:
        mode = "RGB" if self.cfg.channels == 3 else "L"
        notes = {f"images converted from {mode_from} to {mode}": n for mode_from, n in sorted(self.converted.items())}
        self.converted.clear()
        return notes

    def check_value(self, value: str) -> Any:
        """The other column's value as the instance keeps it (default: as read; captions: their token
        ids, checked); raises BadLine when it cannot be used."""
        return value

    def images(self, items: list[tuple[str, np.ndarray]]) -> Ragged:
        return Ragged.from_arrays([image.reshape(self.size[0], self.size[1], self.cfg.channels) for _, image in items],
                                  np.uint8, [self.size[1], self.cfg.channels])

    def pixels(self, instances: Instances, rng: np.random.Generator):
        """Augmented (training) and normalised pixels [B, C, H, W] of the stored images."""
        images = instances.arrays["image"].data.reshape(len(instances), self.size[0], self.size[1], self.cfg.channels)
        return to_pixels(augment(np.array(images), self.cfg.augment, rng), self.mean, self.std)


class VitObjectiveConfig(ImageObjectiveConfig):
    type: Literal["vit"] = "vit"


@OBJECTIVES.register("vit")
class VitObjective(ImageObjective):
    """Labelled images -> pixels and labels.cls (the label map in the manifest)."""

    Config = VitObjectiveConfig
    column = "label"
    provides: ClassVar[frozenset[str]] = frozenset({"pixels", "labels.cls"})
    needs_tokenizer: ClassVar[bool] = False
    corpus_format: ClassVar[str] = ("a header line 'label<TAB>path', then one image per line (PNG, JPEG, ...; "
                                    "relative to the corpus's folder); or JSON lines {\"label\": ..., \"path\": ...}")
    field_names: ClassVar[tuple[str, ...]] = ("label",)

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        kept = [item for item in items if item is not None]
        out = Instances.from_sequences([[] for _ in kept])
        out.labels = [label for label, _ in kept]
        out.arrays["image"] = self.images(kept)
        return out

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        labels = {"cls": to_batch_tensor(instances.fields["label"].astype(np.int64))} \
            if "label" in instances.fields else {}
        return new_batch(pixels=self.pixels(instances, rng), labels=labels)


class ClipObjectiveConfig(ImageObjectiveConfig):
    type: Literal["clip"] = "clip"
    seq_length: int = Field(77, ge=4, description="text tokens per caption, [CLS] and [SEP] included")
    normalise: Literal["half", "imagenet", "clip"] = Field("clip", description="pixel mean and std (CLIP's)")


@OBJECTIVES.register("clip")
class ClipObjective(ImageObjective):
    """Captioned images -> the caption's tokens and the image as the second stream's pixels."""

    Config = ClipObjectiveConfig
    column = "text"
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "segments", "padding_mask", "pair.pixels"})
    corpus_format: ClassVar[str] = ("a header line 'text<TAB>path', then one captioned image per line (relative "
                                    "to the corpus's folder); or JSON lines {\"text\": ..., \"path\": ...}")

    def __init__(self, cfg: ClipObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.require_ids(**{"[CLS] (start of text)": tokenizer.cls_id, "[SEP] (end of text)": tokenizer.sep_id})
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    def check_value(self, value: str) -> list[int]:
        return caption_ids(self.tokenizer, value, self.seq_length - 2, "data.objective.seq_length")

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        kept = [item for item in items if item is not None]
        sequences, _ = assemble_pairs([ids for ids, _ in kept], None, self.cls_id, self.sep_id, self.seq_length)
        out = Instances.from_sequences(sequences)
        out.arrays["image"] = self.images(kept)
        return out

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        ids, valid = instances.padded(self.pad_id)
        return new_batch(tokens=to_batch_tensor(ids), segments=to_batch_tensor(np.zeros_like(ids)),
                         padding_mask=to_batch_tensor(~valid), pair=new_batch(pixels=self.pixels(instances, rng)))


class ViltObjectiveConfig(ClipObjectiveConfig):
    type: Literal["vilt"] = "vilt"
    seq_length: int = Field(40, ge=3, description="caption tokens, [CLS] and [SEP] included (ViLT: 40)")
    normalise: Literal["half", "imagenet", "clip"] = Field("half", description="pixel mean and std")
    patch_size: int = Field(32, ge=1, description="the word_patch part's patch size (the image's positions)")
    negative_prob: float = Field(0.5, gt=0.0, lt=1.0, description="share of rows shown another row's image")
    mask_prob: float = Field(0.15, ge=0.0, lt=1.0, description="share of caption tokens masked (0: matching only)")
    augment: AugmentConfig | None = Field(default_factory=lambda: AugmentConfig(crop_scale=[0.9, 1.0], flip=False),
                                          description="training augmentation (ViLT: no flip, which would break "
                                          "'left'/'right' in captions); null: none")


@OBJECTIVES.register("vilt")
class ViltObjective(ClipObjective):
    """Captioned images -> one sequence (caption, image) with image-text matching and masked LM."""

    Config = ViltObjectiveConfig
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "segments", "padding_mask", "pixels", "labels.sp",
                                                    "labels.mlm"})
    collate_options: ClassVar[frozenset[str]] = frozenset({"normalise", "augment", "negative_prob", "mask_prob"})

    def __init__(self, cfg: ViltObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: ViltObjectiveConfig = cfg
        height, width = self.size
        if height % cfg.patch_size or width % cfg.patch_size:
            raise UserError(f"objective.image_size {list(self.size)} is not a multiple of objective.patch_size "
                            f"{cfg.patch_size}")
        self.image_positions = 1 + (height // cfg.patch_size) * (width // cfg.patch_size)
        self.masker = None
        if cfg.mask_prob > 0:
            from pentad.data.masking import Masker

            self.masker = Masker(tokenizer, cfg.mask_prob)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

        rows = len(instances)
        ids, valid = instances.padded(self.pad_id)
        # negatives: another row's image of the batch (a shift, so never the row's own)
        shown = np.arange(rows)
        negative = rng.random(rows) < self.cfg.negative_prob if rows > 1 else np.zeros(rows, dtype=bool)
        shift = rng.integers(1, rows, size=rows) if rows > 1 else np.zeros(rows, dtype=np.int64)
        shown = np.where(negative, (shown + shift) % rows, shown)
        images = instances.arrays["image"].data.reshape(rows, self.size[0], self.size[1], self.cfg.channels)
        pixels = to_pixels(augment(np.array(images[shown]), self.cfg.augment, rng), self.mean, self.std)
        mlm = np.full((rows, ids.shape[1] + self.image_positions), IGNORE_INDEX, dtype=np.int64)
        if self.masker is not None:
            ids, mlm[:, :ids.shape[1]] = self.masker(ids, valid, rng)
        segments = np.concatenate([np.zeros(ids.shape, dtype=np.int64),
                                   np.ones((rows, self.image_positions), dtype=np.int64)], axis=1)
        return new_batch(tokens=to_batch_tensor(ids), segments=to_batch_tensor(segments),
                         padding_mask=to_batch_tensor(~valid), pixels=pixels,
                         labels={"mlm": to_batch_tensor(mlm), "sp": to_batch_tensor(negative.astype(np.int64))})
