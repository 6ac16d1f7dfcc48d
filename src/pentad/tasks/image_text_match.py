"""Image–text matching with masked LM over the caption, on a single stream over both (ViLT).

The model's embedding slot has a ``word_patch`` part: the caption's word vectors, then the image's
CLS and patches, in one sequence (segments: 0 over the caption, 1 over the image). Its heads are
``sp`` (over the first position: 0 = the image belongs to the caption, 1 = it does not) and ``mlm``
(over the caption's tokens only), as in ViLT's pre-training (Kim et al. 2021).

Files are ``text<TAB>path`` with a header (paths relative to the TSV). Training pairs each caption
with its own image or, with probability ``negative_prob``, with another file's image, drawn anew
for every batch from the batch's seeded generator, and masks ``mask_prob`` of the caption's tokens.
Evaluation files get one fixed draw (seed ``negative_seed``) and no masking; the metric is the
matching accuracy. Inference input is scored as given (each caption with its own image): the
predictions file has the probability that they match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.data.images import NORMALISE, AugmentConfig, augment, load_images, to_pixels
from pentad.errors import UserError
from pentad.registry import TASKS
from pentad.tasks.base import EpochBatches, Task, TaskConfig, in_order, predict_logits
from pentad.tasks.image_text import _read_pairs, encode_captions


class ImageTextMatchTaskConfig(TaskConfig):
    type: Literal["image_text_match"] = "image_text_match"
    negative_prob: float = Field(0.5, gt=0.0, lt=1.0, description="share of captions paired with another image")
    negative_seed: int = Field(0, description="the seed of evaluation files' fixed negatives")
    mask_prob: float = Field(0.15, ge=0.0, lt=1.0, description="share of caption tokens masked while training "
                             "(0: matching only)")
    metric: Literal["itm_accuracy"] = "itm_accuracy"
    normalise: Literal["half", "imagenet", "clip"] = Field("half", description="pixel mean and std")
    augment: AugmentConfig | None = Field(default_factory=lambda: AugmentConfig(crop_scale=[0.9, 1.0], flip=False),
                                          description="training augmentation; null: none")


class MatchInstances:
    """Captions (token Instances), decoded images, image paths, and the evaluation pairing: ``image``
    (which image each caption is shown with) and ``label`` (0 match, 1 not), or None (as given)."""

    def __init__(self, texts, images: np.ndarray, paths: list[str], pairing: np.ndarray | None):
        self.texts, self.images, self.paths = texts, images, np.asarray(paths)
        self.image = pairing if pairing is not None else np.arange(len(images))
        self.fields = {"label": (self.paths[self.image] != self.paths).astype(np.int64)} if pairing is not None else {}

    def __len__(self) -> int:
        return len(self.images)


@TASKS.register("image_text_match")
class ImageTextMatchTask(Task):
    """Image–text matching (ViLT): does the image belong to the caption; masked LM over the caption."""

    Config = ImageTextMatchTaskConfig
    input_format = "text<TAB>path (paths relative to the TSV)"
    metric_names = ("itm_accuracy",)
    provides = frozenset({"tokens", "segments", "padding_mask", "pixels", "labels.sp", "labels.mlm"})

    def __init__(self, cfg: ImageTextMatchTaskConfig, tokenizer, seq_length: int, state=None):
        self.image_size: tuple[int, int] | None = None
        self.max_pixels = DEFAULT_MAX_IMAGE_PIXELS
        self.channels = 3
        self.image_positions = 0
        self.heads: list[dict[str, Any]] = []
        self.masker = None
        super().__init__(cfg, tokenizer, seq_length, state)
        self.mean, self.std = NORMALISE[cfg.normalise]
        self.pad_id = int(tokenizer.pad_id or 0) if tokenizer is not None else 0

    def bind(self, run_cfg: Any) -> None:
        part = next((p for p in run_cfg.model.embedding.parts if p.type == "word_patch"), None)
        if part is None:
            raise UserError("task image_text_match reads a caption and an image as one sequence: model.embedding "
                            "needs a 'word_patch' part (e.g. --config vilt/base)")
        heads = {t.type: t for t in run_cfg.model.targets}
        missing = [kind for kind in ("sp", "mlm") if kind not in heads]
        if missing:
            raise UserError(f"task image_text_match trains an sp head (matching) and an mlm head (the caption); "
                            f"model.targets lacks {' and '.join(missing)}")
        self.heads = [{**heads[kind].model_dump(), "name": kind} for kind in ("mlm", "sp")]
        self.image_size, self.channels = (part.patch.image_size[0], part.patch.image_size[1]), part.patch.channels
        self.max_pixels = run_cfg.data.max_image_pixels
        self.image_positions = part.patch.length
        room = run_cfg.model.max_seq_length - self.image_positions
        if room < 3:
            raise UserError(f"model.max_seq_length={run_cfg.model.max_seq_length} leaves no room for a caption "
                            f"beside the image's {self.image_positions} positions")
        self.seq_length = min(self.seq_length, room)
        if self.cfg.mask_prob > 0:
            from pentad.data.masking import Masker

            self.masker = Masker(self.tokenizer, self.cfg.mask_prob)

    def head_configs(self) -> list[dict[str, Any]]:
        return self.heads

    def head_names(self) -> tuple[str, ...]:
        return ()

    def read(self, path: Path, with_labels: bool = True) -> MatchInstances:
        path = Path(path)
        return self._load(path, _read_pairs(path), with_labels)

    def read_windows(self, path: Path, window: int):
        """Windows of caption-image pairs (inference pairs each caption with its own image)."""
        from pentad.data.tsv import iter_path_tsv

        return (self._load(Path(path), [(text, image, line) for line, image, text in rows], False)
                for rows in iter_path_tsv(path, "text", True, "captioned image", window))

    def _load(self, path: Path, rows: list[tuple[str, str, int]], with_labels: bool) -> MatchInstances:
        texts = encode_captions(rows, path, self.tokenizer, self.seq_length)  # before decoding any image
        images = load_images([path.parent / p for _, p, _ in rows], [n for _, _, n in rows], path,
                             self.image_size, self.channels, self.max_pixels)
        paths = [p for _, p, _ in rows]
        pairing = None
        if with_labels:
            pairing = self._pairing(np.asarray(paths), np.arange(len(rows)),
                                    np.random.default_rng(self.cfg.negative_seed))
        return MatchInstances(texts, images, paths, pairing)

    def _pairing(self, paths: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The image shown with each of ``rows``: its own, or (``negative_prob``) another file's."""
        image = rows.copy()
        distinct = np.unique(paths).size > 1
        for i, row in enumerate(rows):
            if distinct and rng.random() < self.cfg.negative_prob:
                other = int(rng.integers(0, len(paths)))
                while paths[other] == paths[row]:
                    other = int(rng.integers(0, len(paths)))
                image[i] = other
        return image

    def _batch(self, instances: MatchInstances, indices, rng: np.random.Generator | None) -> Batch:
        idx = np.asarray(indices)
        ids, valid = instances.texts[idx].padded(self.pad_id)
        image = self._pairing(instances.paths, idx, rng) if rng is not None else instances.image[idx]
        pixels = instances.images[image]
        labels: dict[str, torch.Tensor] = {}
        if rng is not None:
            pixels = augment(pixels, self.cfg.augment, rng)
            mlm = np.full((len(idx), ids.shape[1] + self.image_positions), IGNORE_INDEX, dtype=np.int64)
            if self.masker is not None:
                ids, mlm[:, :ids.shape[1]] = self.masker(ids, valid, rng)
            labels["mlm"] = torch.from_numpy(mlm)
        if rng is not None or instances.fields:
            labels["sp"] = torch.from_numpy((instances.paths[image] != instances.paths[idx]).astype(np.int64))
        segments = np.concatenate([np.zeros(ids.shape, dtype=np.int64),
                                   np.ones((len(idx), self.image_positions), dtype=np.int64)], axis=1)
        return Batch(tokens=torch.from_numpy(ids), segments=torch.from_numpy(segments),
                     padding_mask=torch.from_numpy(~valid), pixels=to_pixels(pixels, self.mean, self.std),
                     labels=labels)

    def collate(self, instances: MatchInstances, indices, rng: np.random.Generator) -> Batch:
        return self._batch(instances, indices, None)

    def train_batches(self, instances: MatchInstances, batch_size: int, seed: int) -> EpochBatches:
        return EpochBatches(len(instances), batch_size, seed, lambda idx, rng: self._batch(instances, idx, rng))

    def predict(self, model, instances: MatchInstances, batch_size: int, device, progress: str | None = None):
        """The matching head's logits [N, 2]."""
        batches = (self.collate(instances, idx, None) for idx in in_order(len(instances), batch_size, progress))
        return predict_logits(model, batches, "sp", device)

    def score(self, logits: torch.Tensor, instances, gold: np.ndarray) -> dict[str, float]:
        return {"itm_accuracy": float((logits.argmax(-1).numpy() == gold).mean()) if len(gold) else 0.0}

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``match<TAB>probability``: 1 when the image belongs to the caption."""
        return "match\tprobability"

    def prediction_lines(self, logits: torch.Tensor, instances, probabilities: bool) -> list[str]:
        match = torch.softmax(logits.float(), dim=-1)[:, 0].numpy()
        return [f"{int(p >= 0.5)}\t{p:.6f}" for p in match]
