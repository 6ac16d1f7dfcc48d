"""Image classification (ViT and other patch models): TSV ``label<TAB>path`` -> ``cls`` head.

The file has a header line naming its columns, ``label`` and ``path`` (TencentPretrain's format;
inference input may leave ``label`` out). Paths are relative to the TSV file's folder, or
absolute. Images are decoded and resized to the model's image size when the file is read
(``pentad.data.images``); training batches are augmented with the batch's seeded generator
(random resized crop, random affine, horizontal flip: ``task.augment``; mixup and CutMix:
``task.mix``), evaluation batches never are.
The model needs no tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import Batch
from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS
from pentad.data.images import NORMALISE, AugmentConfig, MixConfig, augment, load_images, mix_batch, to_pixels
from pentad.data.tsv import LabelMap, TsvRow, iter_path_tsv, read_path_tsv
from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import TASKS
from pentad.tasks.base import EpochBatches, Task, TaskConfig, classification_metrics, in_order, predict_logits


class ImageClassificationTaskConfig(TaskConfig):
    type: Literal["image_classification"] = "image_classification"
    num_labels: int | None = Field(None, ge=2, description="default: the labels found in the training set")
    pooling: PoolingKind = Field("first", description="what the head reads: first (the CLS position) or mean "
                                 "(over every position)")
    pooler: bool = Field(False, description="dense + tanh before the classifier (TencentPretrain's cls head); "
                         "ViT's has none")
    head_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="training loss against targets with this "
                                   "mass spread evenly over every class (DeiT: 0.1); 0: none")
    metric: Literal["accuracy", "macro_f1", "top5"] = Field("accuracy", description="dev metric that picks "
                                                            "the best model")
    normalise: Literal["half", "imagenet", "clip"] = Field(
        "half", description="pixel mean and std: half (0.5, 0.5: Hugging Face ViT), imagenet (BEiT, timm), "
        "clip (CLIP's)")
    augment: AugmentConfig | None = Field(default_factory=AugmentConfig, description="training augmentation; "
                                          "null: none")
    mix: MixConfig | None = Field(None, description="mixup / CutMix of training batches, with targets weighted "
                                  "by each image's share ({} for DeiT's: mixup 0.8, CutMix 1.0, half each); "
                                  "null: none")


class ImageInstances:
    """Decoded images uint8 [N,H,W,C], label ids (or None) and the TSV lines they came from."""

    def __init__(self, images: np.ndarray, labels: np.ndarray | None, lines: list[int]):
        self.images, self.labels, self.lines = images, labels, lines
        self.fields = {"label": labels} if labels is not None else {}

    def __len__(self) -> int:
        return len(self.images)


def read_image_tsv(path: Path, with_labels: bool) -> list[TsvRow]:
    """The rows of a ``label<TAB>path`` file (``text_a`` holds the image path as written)."""
    rows = read_path_tsv(path, "label", with_labels, "image")
    return [TsvRow(line, image, None, label) for line, image, label in rows]


@TASKS.register("image_classification")
class ImageClassificationTask(Task):
    """Image classification: a softmax head over a patch model's CLS state (accuracy, top-5)."""

    Config = ImageClassificationTaskConfig
    head = "cls"
    needs_tokenizer = False
    input_format = "label<TAB>path (paths relative to the TSV)"
    metric_names = ("accuracy", "macro_f1", "top5")
    provides = frozenset({"pixels", "labels.cls"})

    def __init__(self, cfg: ImageClassificationTaskConfig, tokenizer, seq_length: int, state=None):
        self.label_map: LabelMap | None = None
        self.image_size: tuple[int, int] | None = None
        self.max_pixels = DEFAULT_MAX_IMAGE_PIXELS
        self.channels = 3
        super().__init__(cfg, tokenizer, seq_length, state)
        self.mean, self.std = NORMALISE[cfg.normalise]

    def bind(self, run_cfg: Any) -> None:
        """The image size and channels of the model's patch embedding."""
        patch = next((p for p in run_cfg.model.embedding.parts if getattr(p, "type", "") in ("patch", "masked_patch")),
                     None)
        if patch is None:
            kinds = [p.type for p in run_cfg.model.embedding.parts]
            raise UserError(f"task image_classification reads images, but model.embedding.parts is {kinds}: "
                            "it needs a 'patch' part (a ViT recipe, e.g. --config vit/base-16)")
        self.image_size, self.channels = (patch.image_size[0], patch.image_size[1]), patch.channels
        self.max_pixels = run_cfg.data.max_image_pixels

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train_path: Path) -> None:
        rows = read_image_tsv(train_path, with_labels=True)
        self.label_map = LabelMap.from_rows(rows, train_path, num_labels=self.cfg.num_labels)
        if self.label_map.num_labels < 2:
            raise UserError(f"{train_path}: every example has the label {self.label_map.names}; a classifier needs "
                            "at least two classes (or set task.num_labels)")

    def state(self) -> dict[str, Any]:
        return self.label_map.to_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        self.label_map = LabelMap.from_dict(state)

    def describe(self) -> str:
        return f"{self.label_map.num_labels} labels {self.label_map.names}"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "cls", "num_labels": self.label_map.num_labels, "pooling": self.cfg.pooling,
                 "pooler": self.cfg.pooler, "dropout": self.cfg.head_dropout,
                 "label_smoothing": self.cfg.label_smoothing}]

    # ---------------------------------------------------------------- data
    def read(self, path: Path, with_labels: bool = True) -> ImageInstances:
        if self.image_size is None:
            raise RuntimeError("bind() gives the task its image size before read()")
        return self._load(Path(path), read_image_tsv(path, with_labels), with_labels)

    def read_windows(self, path: Path, window: int):
        if self.image_size is None:
            raise RuntimeError("bind() gives the task its image size before read_windows()")
        return (self._load(Path(path), [TsvRow(line, image, None, label) for line, image, label in rows], False)
                for rows in iter_path_tsv(path, "label", False, "image", window))

    def _load(self, path: Path, rows: list[TsvRow], with_labels: bool) -> ImageInstances:
        images = load_images([(path.parent / r.text_a) for r in rows], [r.line for r in rows], path,
                             self.image_size, self.channels, self.max_pixels)
        labels = None
        if with_labels and all(r.label is not None for r in rows):
            labels = np.asarray([self.label_map.encode(r.label, path, r.line) for r in rows], dtype=np.int64)
        return ImageInstances(images, labels, [r.line for r in rows])

    def _batch(self, instances: ImageInstances, indices, rng: np.random.Generator | None) -> Batch:
        index = np.asarray(indices)
        images = instances.images[index]
        if rng is not None:
            images = augment(images, self.cfg.augment, rng)
        batch = Batch(pixels=to_pixels(images, self.mean, self.std))
        if instances.labels is not None:
            labels = instances.labels[index]
            if rng is not None and self.cfg.mix is not None:
                # the head then trains on the target distributions [B, num_labels]
                batch.pixels, batch.labels[self.head] = mix_batch(batch.pixels, labels, self.label_map.num_labels,
                                                                  self.cfg.mix, rng)
            else:
                batch.labels[self.head] = torch.from_numpy(labels)
        return batch

    def collate(self, instances: ImageInstances, indices, rng: np.random.Generator) -> Batch:
        """An evaluation batch (not augmented)."""
        return self._batch(instances, indices, None)

    def train_batches(self, instances: ImageInstances, batch_size: int, seed: int) -> EpochBatches:
        """Augmented batches, each drawn with the batch's own seeded generator (so a resumed run sees the
        same crops and flips as an uninterrupted one)."""
        return EpochBatches(len(instances), batch_size, seed, lambda idx, rng: self._batch(instances, idx, rng))

    # ---------------------------------------------------------------- evaluation and output
    def predict(self, model, instances: ImageInstances, batch_size: int, device, progress: str | None = None):
        """The head's logits [N, num_labels]."""
        batches = (self.collate(instances, idx, None) for idx in in_order(len(instances), batch_size, progress))
        return predict_logits(model, batches, self.head, device)

    def score(self, predictions: torch.Tensor, instances, gold: np.ndarray) -> dict[str, float]:
        metrics = classification_metrics(predictions.argmax(-1).numpy(), gold, self.label_map.num_labels)
        k = min(5, predictions.shape[-1])
        top = predictions.topk(k, dim=-1).indices.numpy()
        metrics["top5"] = float((top == gold[:, None]).any(axis=1).mean()) if len(gold) else 0.0
        return metrics

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``label`` (and one ``prob_<label>`` column per class on request)."""
        return "\t".join(["label"] + ([f"prob_{n}" for n in self.label_map.names] if probabilities else []))

    def prediction_lines(self, logits: torch.Tensor, instances, probabilities: bool) -> list[str]:
        names = list(self.label_map.names)
        probs = torch.softmax(logits, dim=-1).numpy()
        return ["\t".join([names[int(p)]] + ([f"{x:.6f}" for x in row] if probabilities else []))
                for p, row in zip(logits.argmax(-1).numpy(), probs)]
