"""Regression head: the ``cls`` head's layers with one output and a mean squared error
(TencentPretrain's ``run_regression``)."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, TargetOutput
from pentad.components.targets.cls import ClsTarget
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.pooling import PoolingKind
from pentad.layers.soft_labels import SoftLoss
from pentad.registry import TARGETS


class RegressionTargetConfig(TargetConfigBase):
    type: Literal["regression"] = "regression"
    pooling: PoolingKind = "first"
    pooler: bool = Field(True, description="dense + tanh after pooling (BERT's pooler)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


@TARGETS.register("regression")
class RegressionTarget(ClsTarget):
    """hidden [B,S,H] -> one value per row, as logits [B, 1]; labels [B] float; loss: mean squared error."""

    Config = RegressionTargetConfig

    def __init__(self, name: str, hidden_size: int, pooling: PoolingKind = "first", pooler: bool = True,
                 dropout: float = 0.1):
        super().__init__(name, hidden_size, 1, pooling, pooler, dropout)

    @classmethod
    def from_config(cls, cfg: RegressionTargetConfig, model) -> RegressionTarget:  # type: ignore[override]
        return cls(cfg.target_name, model.hidden_size, cfg.pooling, cfg.pooler, cfg.dropout)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        values = self.scores(hidden, batch)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=values)
        return TargetOutput(loss=F.mse_loss(values[:, 0].float(), labels.float()), logits=values)

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """The mean squared error to the teacher's predicted values, whatever ``kind`` (a value has no
        distribution to soften)."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        return F.mse_loss(student.logits[:, 0].float(), teacher.logits[:, 0].detach().float())
