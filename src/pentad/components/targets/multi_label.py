"""Multi-label classification head: the ``cls`` head's layers with one sigmoid per label and a
binary cross-entropy loss (TencentPretrain's ``run_classifier_multi_label``)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, TargetOutput
from pentad.components.targets.cls import ClsTarget
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.pooling import PoolingKind
from pentad.layers.soft_labels import SoftLoss, binary_soft_label_loss
from pentad.registry import TARGETS


class MultiLabelTargetConfig(TargetConfigBase):
    type: Literal["multi_label"] = "multi_label"
    num_labels: int | None = Field(None, ge=1, description="set by the task from its label set")
    pooling: PoolingKind = "first"
    pooler: bool = Field(True, description="dense + tanh after pooling (BERT's pooler)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)

    def check(self, model) -> list[tuple[str, str]]:
        if self.num_labels is None:
            return [("num_labels", "the number of labels is not set (the multi_label task sets it from its "
                                   "training data; set it yourself to build the head alone)")]
        return []


@TARGETS.register("multi_label")
class MultiLabelTarget(ClsTarget):
    """hidden [B,S,H] -> logits [B, num_labels] (one independent sigmoid each); labels [B, num_labels]
    in {0, 1}. The loss is the binary cross-entropy averaged over rows and labels; the metrics count
    rows whose whole label set is right at threshold 0.5 (``correct``) and rows (``count``)."""

    Config = MultiLabelTargetConfig

    @classmethod
    def from_config(cls, cfg: MultiLabelTargetConfig, model) -> MultiLabelTarget:  # type: ignore[override]
        return cls(cfg.target_name, model.hidden_size, cfg.num_labels or 1, cfg.pooling, cfg.pooler, cfg.dropout)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.scores(hidden, batch)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        labels = labels.float()
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        with torch.no_grad():
            correct = ((logits > 0) == (labels > 0.5)).all(dim=-1).sum()
        return TargetOutput(loss=loss, logits=logits,
                            metrics={"correct": correct, "count": torch.tensor(labels.shape[0], device=labels.device)})

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """One sigmoid per label: the Bernoulli KL of the softened sigmoids (or the logits' MSE), averaged
        over rows and labels like the binary cross-entropy."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        return binary_soft_label_loss(student.logits, teacher.logits, temperature, kind)
