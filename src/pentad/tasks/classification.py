"""Sentence and sentence-pair classification: TSV ``label\ttext_a[\ttext_b]`` -> ``cls`` head.

Training, evaluation and inference read files through the same code (``pentad.data.tsv``) and
batch through the ``cls`` objective's collate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.config.base import StrictModel
from pentad.layers.pooling import PoolingKind
from pentad.registry import OBJECTIVES, TASKS
from pentad.tasks.base import Task, classification_metrics, in_order, predict_logits


class ClassificationTaskConfig(StrictModel):
    type: Literal["classification"] = "classification"
    num_labels: int | None = Field(None, ge=2, description="default: the labels found in the training set")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["accuracy", "macro_f1"] = Field("accuracy", description="dev metric that picks the best model")
    probabilities: bool = Field(False, description="inference also writes class probabilities")


@TASKS.register("classification")
class ClassificationTask(Task):
    """Reads labelled TSVs, owns the label map, evaluates accuracy / macro-F1, writes predictions."""

    Config = ClassificationTaskConfig
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.cls"})
    head = "cls"

    def __init__(self, cfg: ClassificationTaskConfig, tokenizer, seq_length: int, label_map=None):
        from pentad.data.objectives.cls import ClsObjectiveConfig

        self.cfg = cfg
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        self.label_map = label_map
        self.objective = OBJECTIVES.get("cls")(ClsObjectiveConfig(seq_length=seq_length), tokenizer)

    # ---------------------------------------------------------------- data
    def fit_labels(self, train_path: Path) -> None:
        """Build the label map from the training file (ids 0..n-1 if all labels are integers)."""
        from pentad.data.tsv import LabelMap, read_classification_tsv

        rows, _ = read_classification_tsv(train_path, with_labels=True)
        self.label_map = LabelMap.from_rows(rows, train_path, num_labels=self.cfg.num_labels)

    def read(self, path: Path, with_labels: bool = True) -> tuple[list[Any], list[Any]]:
        """(rows, instances) of a TSV file."""
        from pentad.data.tsv import encode_classification, read_classification_tsv

        rows, _ = read_classification_tsv(path, with_labels=with_labels)
        instances = encode_classification(rows, self.tokenizer, self.seq_length,
                                          self.label_map if with_labels else None, path=path)
        return rows, instances

    def collate(self, instances, indices, rng: np.random.Generator):
        return self.objective.collate(instances[np.asarray(indices)], rng)

    @property
    def num_labels(self) -> int:
        return self.label_map.num_labels

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "cls", "num_labels": self.num_labels, "pooling": self.cfg.pooling,
                 "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- evaluation and output
    def evaluate(self, model, instances, labels: np.ndarray, batch_size: int, device) -> dict[str, float]:
        logits = self.logits(model, instances, batch_size, device)
        return classification_metrics(logits.argmax(-1).numpy(), labels, self.num_labels)

    def logits(self, model, instances, batch_size: int, device) -> torch.Tensor:
        rng = np.random.default_rng(0)
        n = len(instances)
        batches = (self.collate(instances, idx, rng) for idx in in_order(n, batch_size))
        return predict_logits(model, batches, self.head, device)

    def write_predictions(self, path: Path, logits: torch.Tensor, probabilities: bool) -> None:
        """TSV with header ``label`` (and one ``prob_<label>`` column per class on request)."""
        from pentad.training.checkpoint import atomic_write_text

        names = list(self.label_map.names)
        probs = torch.softmax(logits, dim=-1).numpy()
        preds = logits.argmax(-1).numpy()
        header = ["label"] + ([f"prob_{n}" for n in names] if probabilities else [])
        lines = ["\t".join(header)]
        for p, row in zip(preds, probs):
            cols = [names[int(p)]] + ([f"{x:.6f}" for x in row] if probabilities else [])
            lines.append("\t".join(cols))
        atomic_write_text(path, "\n".join(lines) + "\n")


