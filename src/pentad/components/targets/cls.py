"""Sequence classification head: pooling -> (dense + tanh) -> dropout -> classifier."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase, classification_loss
from pentad.layers.dropout import Dropout
from pentad.layers.pooling import PoolingKind, pool
from pentad.registry import TARGETS


class ClsTargetConfig(TargetConfigBase):
    type: Literal["cls"] = "cls"
    num_labels: int | None = Field(None, ge=2, description="set by the task from its label set")
    pooling: PoolingKind = "first"
    pooler: bool = Field(True, description="dense + tanh after pooling (BERT's pooler)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="training loss: cross-entropy against "
                                   "targets that put this mass evenly on every class (torch's, as DeiT trains "
                                   "ViTs); 0: none")

    def check(self, model) -> list[tuple[str, str]]:
        if self.num_labels is None:
            return [("num_labels", "the number of labels is not set (a classification task sets it from "
                                   "its training data; set it yourself to build the head alone)")]
        return []


@TARGETS.register("cls")
class ClsTarget(Target):
    """hidden [B,S,H] -> logits [B, num_labels]; labels [B]."""

    Config = ClsTargetConfig

    def __init__(self, name: str, hidden_size: int, num_labels: int, pooling: PoolingKind = "first",
                 pooler: bool = True, dropout: float = 0.1, label_smoothing: float = 0.0):
        super().__init__(name)
        self.label_smoothing = label_smoothing
        self.pooling = pooling
        self.pooler = nn.Linear(hidden_size, hidden_size) if pooler else None
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    @classmethod
    def from_config(cls, cfg: ClsTargetConfig, model) -> ClsTarget:
        return cls(cfg.target_name, model.hidden_size, cfg.num_labels or 2, cfg.pooling, cfg.pooler,
                   cfg.dropout, cfg.label_smoothing)

    def positions_read(self) -> int | None:
        """1 with ``first`` pooling (the CLS state alone), else None."""
        return 1 if self.pooling == "first" else None

    def scores(self, hidden: Tensor, batch: Batch) -> Tensor:
        """hidden [B,S,H] -> the classifier's outputs [B, num_labels] (before any loss)."""
        pooled = pool(hidden, batch.padding_mask, self.pooling)
        if self.pooler is not None:
            pooled = self.pooler(pooled).tanh()
        return self.classifier(self.dropout(pooled))

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.scores(hidden, batch)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        loss, metrics = classification_loss(logits, labels, self.label_smoothing if self.training else 0.0)
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)
