"""Similarity regression over the two pooled streams of a two-stream model: the cosine of (u, v)
regresses a gold score with a mean squared error (SBERT's regression objective, Reimers &
Gurevych 2019, section 3, used for STS benchmark training)."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, PooledPair, Target, TargetOutput
from pentad.components.stream import pair_widths
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.soft_labels import SoftLoss
from pentad.registry import TARGETS


class CosineTargetConfig(TargetConfigBase):
    type: Literal["cosine"] = "cosine"
    scale: float = Field(1.0, gt=0.0, description="gold scores are divided by this (STS-B: 5.0) so that "
                         "they compare with cosines in [-1, 1]")

    def check(self, model) -> list[tuple[str, str]]:
        widths = pair_widths(model, self)
        if widths[0] != widths[1]:
            return [("type", f"cosine compares vectors of one width; the streams are {widths[0]} and "
                             f"{widths[1]} wide")]
        return []


@TARGETS.register("cosine")
class CosineTarget(Target):
    """PooledPair (u [B,H], v [B,H]) -> cosine [B] (as logits [B,1]); labels [B] float scores."""

    Config = CosineTargetConfig
    reads_pair = True

    def __init__(self, name: str, scale: float = 1.0):
        super().__init__(name)
        self.scale = scale

    @classmethod
    def from_config(cls, cfg: CosineTargetConfig, model) -> CosineTarget:
        return cls(cfg.target_name, cfg.scale)

    def forward(self, hidden: PooledPair, batch: Batch) -> TargetOutput:  # type: ignore[override]
        cosine = F.cosine_similarity(hidden.first.float(), hidden.second.float(), dim=-1)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=cosine[:, None])
        loss = F.mse_loss(cosine, labels.float() / self.scale)
        return TargetOutput(loss=loss, logits=cosine[:, None])

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """The mean squared error to the teacher's cosines, whatever ``kind`` (on the scale of the head's
        own loss: the gold scores are divided by ``scale``, the cosines are not)."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        return F.mse_loss(student.logits[:, 0].float(), teacher.logits[:, 0].detach().float())
