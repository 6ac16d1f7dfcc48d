"""BEiT's masked image modelling (Bao et al., "BEiT: BERT Pre-Training of Image Transformers", 2021):
objective ``beit``.

The corpus names one image per line: a header line ``path`` then a path per line, or JSON lines
``{"path": ...}`` (paths relative to the corpus's folder). Preprocessing decodes each image as
``vit`` does (:class:`~pentad.data.objectives.vision.ImageObjective`) and stores, as the instance's
tokens, its visual tokens: the ids of its patches in the image tokenizer's codebook
(``image_tokenizer``, a file ``pentad image-tokenizer fit`` writes; :mod:`pentad.data.image_tokenizer`).

Collate masks about ``mask_ratio`` of each image's patches blockwise (the paper's Algorithm 1):
rectangles of at least ``min_block_patches`` patches with an aspect ratio drawn log-uniformly from
``block_aspect``..1/``block_aspect`` are added until the masked count reaches the target, a block
never adding more than what is left. Batches: ``pixels [B, C, H, W]``, ``patch_mask [B, N]`` (True:
masked; the ``masked_patch`` embedding part replaces those patches by its mask vector) and
``labels["mlm"] [B, S]``: the visual token of each masked patch, IGNORE_INDEX elsewhere and at the
CLS position (S = N, + 1 when the patch part has a CLS vector), for an ``mlm`` head over the
codebook (``model.vocab_size`` = the codebook size).

With ``augment`` (off by default) the tokens are those of the augmented view, encoded again in the
loader worker, so the labels always describe the pixels the model sees.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.image_tokenizer import load_for_objective
from pentad.data.images import AugmentConfig, augment, to_pixels
from pentad.data.objectives.base import new_batch, to_batch_tensor
from pentad.data.objectives.vision import ImageObjective, ImageObjectiveConfig
from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.log import info
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


def mask_blocks(rows: int, cols: int, count: int, rng: np.random.Generator, min_patches: int = 16,
                aspect: float = 0.3, attempts: int = 10) -> list[tuple[int, int, int, int]]:
    """The blocks (top, left, height, width) of one image's blockwise mask (BEiT, Algorithm 1): about
    ``count`` of the ``rows x cols`` patches, in rectangles of at least ``min(min_patches, what is
    left)`` patches drawn until ``count`` are covered; a block adds at most what is left. After
    ``attempts`` draws that add nothing (or too much), the mask stays as it is."""
    covered = np.zeros((rows, cols), dtype=bool)
    blocks: list[tuple[int, int, int, int]] = []
    done = 0
    log_aspect = (math.log(aspect), math.log(1.0 / aspect))
    while done < count:
        left_over = count - done
        low = min(min_patches, left_over)
        added = 0
        for _ in range(attempts):
            area = rng.uniform(low, max(low, left_over))
            ratio = math.exp(rng.uniform(*log_aspect))
            height = int(round(math.sqrt(area * ratio)))
            width = int(round(math.sqrt(area / ratio)))
            if not (1 <= height <= rows and 1 <= width <= cols):
                continue
            top = int(rng.integers(0, rows - height + 1))
            left = int(rng.integers(0, cols - width + 1))
            new = height * width - int(covered[top:top + height, left:left + width].sum())
            if 0 < new <= left_over:
                covered[top:top + height, left:left + width] = True
                blocks.append((top, left, height, width))
                added = new
                break
        if not added:
            break
        done += added
    return blocks


def block_mask(batch: int, rows: int, cols: int, ratio: float, rng: np.random.Generator, min_patches: int = 16,
               aspect: float = 0.3) -> np.ndarray:
    """bool ``[batch, rows * cols]``: each image's blockwise mask of about ``ratio`` of its patches."""
    count = int(round(ratio * rows * cols))
    out = np.zeros((batch, rows, cols), dtype=bool)
    for b in range(batch):
        for top, left, height, width in mask_blocks(rows, cols, count, rng, min_patches, aspect):
            out[b, top:top + height, left:left + width] = True
    return out.reshape(batch, rows * cols)


class BeitObjectiveConfig(ImageObjectiveConfig):
    type: Literal["beit"] = "beit"
    image_tokenizer: Path | None = Field(None, description="the image tokenizer file (pentad image-tokenizer fit): "
                                         "its codebook's ids are the visual tokens the model predicts")
    mask_ratio: float = Field(0.4, gt=0.0, lt=1.0, description="share of each image's patches masked")
    min_block_patches: int = Field(16, ge=1, description="smallest masked block, in patches")
    block_aspect: float = Field(0.3, gt=0.0, le=1.0, description="block aspect ratios are drawn log-uniformly "
                                "from this..1/this")
    normalise: Literal["half", "imagenet", "clip"] = Field("imagenet", description="pixel mean and std (BEiT's: "
                                                           "imagenet)")
    augment: AugmentConfig | None = Field(None, description="training augmentation (null: none); the visual "
                                          "tokens are then encoded from the augmented view in the loader")


@OBJECTIVES.register("beit")
class BeitObjective(ImageObjective):
    """Images -> pixels, a blockwise patch_mask and labels.mlm: the masked patches' visual tokens."""

    Config = BeitObjectiveConfig
    column = None
    collate_options: ClassVar[frozenset[str]] = frozenset({"normalise", "augment", "mask_ratio",
                                                           "min_block_patches", "block_aspect"})
    provides: ClassVar[frozenset[str]] = frozenset({"pixels", "patch_mask", "labels.mlm"})
    needs_tokenizer: ClassVar[bool] = False
    corpus_format: ClassVar[str] = ("a header line 'path', then one image per line (PNG, JPEG, ...; relative to "
                                    "the corpus's folder); or JSON lines {\"path\": ...}")
    target: ClassVar[str] = "mlm"

    def __init__(self, cfg: BeitObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: BeitObjectiveConfig = cfg
        self.image_tokenizer, self.grid = load_for_objective(
            cfg.image_tokenizer, "beit", "the visual tokens it predicts", self.size, cfg.channels)
        self.first = 1  # the CLS position before the patches (check_model reads the model's patch part)

    def instance_options(self) -> dict[str, Any]:
        # the stored tokens depend on the codebook, not on where its file lies
        options = super().instance_options()
        options.pop("image_tokenizer", None)
        options["image_tokenizer_fingerprint"] = self.image_tokenizer.fingerprint()
        return options

    def manifest_extra(self) -> dict[str, Any]:
        image = self.image_tokenizer
        return {"image_tokenizer": {"file": str(self.cfg.image_tokenizer), "fingerprint": image.fingerprint(),
                                    "patch_size": image.patch_size, "codebook_size": image.codebook_size}}

    def check_model(self, model: Any) -> None:
        """The model must cut the images into the tokenizer's patches and predict over its codebook."""
        image, where = self.image_tokenizer, f"data.objective.image_tokenizer {self.cfg.image_tokenizer}"
        parts = [p for p in getattr(getattr(model, "embedding", None), "parts", None) or []
                 if getattr(p, "type", None) in ("masked_patch", "patch")]
        if not parts or parts[0].type != "masked_patch":
            found = parts[0].type if parts else "none"
            raise UserError(f"objective 'beit' masks patches: model.embedding needs a masked_patch part (found "
                            f"{found}); e.g. the beit/base TencentPretrain config")
        patch = parts[0]
        if patch.patch_size != image.patch_size:
            raise UserError(f"{where} has {image.patch_size}-pixel patches, but the model's masked_patch part has "
                            f"patch_size {patch.patch_size}: the visual tokens must describe the model's patches. "
                            "Fit a tokenizer with the model's patch size or change model.embedding's patch_size")
        if list(patch.image_size) != list(self.size) or patch.channels != self.cfg.channels:
            raise UserError(f"data.objective.image_size {list(self.size)} / channels {self.cfg.channels} differ from "
                            f"the masked_patch part's image_size {list(patch.image_size)} / channels {patch.channels}")
        vocab = getattr(model, "vocab_size", None)
        if vocab is None:
            model.vocab_size = image.codebook_size
        elif vocab < image.codebook_size:
            raise UserError(f"model.vocab_size {vocab} is smaller than {where}'s {image.codebook_size} codes: the "
                            f"mlm head predicts the visual tokens; set model.vocab_size={image.codebook_size}")
        elif vocab > image.codebook_size:
            info(f"note: model.vocab_size {vocab} is larger than {where}'s {image.codebook_size} codes; ids from "
                 f"{image.codebook_size} on are never a label (set model.vocab_size={image.codebook_size} to save "
                 "the unused rows of the mlm head)")
        self.first = int(bool(patch.cls))

    def build(self, items: list[Any], rng: np.random.Generator) -> Instances:
        kept = [item for item in items if item is not None]
        images = self.images(kept)
        stacked = images.data.reshape(len(kept), self.size[0], self.size[1], self.cfg.channels)
        out = Instances.from_sequences(list(self.image_tokenizer.encode(stacked)) if kept else [])
        out.arrays["image"] = images
        return out

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        from pentad.components.base import IGNORE_INDEX  # torch: collate runs in loader workers only

        count = len(instances)
        images = np.array(instances.arrays["image"].data.reshape(count, self.size[0], self.size[1], self.cfg.channels))
        if self.cfg.augment is not None:
            images = augment(images, self.cfg.augment, rng)
            ids = self.image_tokenizer.encode(images)
        else:
            ids = instances.tokens.reshape(count, -1).astype(np.int64)
        rows, cols = self.grid
        mask = block_mask(count, rows, cols, self.cfg.mask_ratio, rng, self.cfg.min_block_patches,
                          self.cfg.block_aspect)
        labels = np.full((count, self.first + rows * cols), IGNORE_INDEX, dtype=np.int64)
        labels[:, self.first:] = np.where(mask, ids, IGNORE_INDEX)
        return new_batch(pixels=to_pixels(images, self.mean, self.std), patch_mask=to_batch_tensor(mask),
                         labels={self.target: to_batch_tensor(labels)})
