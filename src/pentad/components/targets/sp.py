"""Sentence prediction head (BERT next-sentence, ALBERT sentence order): first token -> 2 classes."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from pentad.components.base import Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase, classification_loss
from pentad.registry import TARGETS


class SpTargetConfig(TargetConfigBase):
    type: Literal["sp"] = "sp"


@TARGETS.register("sp")
class SpTarget(Target):
    """hidden[:, 0] -> pooler (dense + tanh) -> classifier [B, 2]. labels [B] (0 = is next)."""

    Config = SpTargetConfig

    def __init__(self, name: str, hidden_size: int):
        super().__init__(name)
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, 2)

    @classmethod
    def from_config(cls, cfg: SpTargetConfig, model) -> SpTarget:
        return cls(cfg.target_name, model.hidden_size)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.classifier(self.pooler(hidden[:, 0]).tanh())
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        loss, metrics = classification_loss(logits, labels)
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)


class SopTargetConfig(TargetConfigBase):
    type: Literal["sop"] = "sop"


@TARGETS.register("sop")
class SopTarget(SpTarget):
    """ALBERT's sentence-order prediction: the ``sp`` head under its own name, reading
    ``labels.sop`` (0 = segments in order, 1 = swapped)."""

    Config = SopTargetConfig
