"""Multiple-choice head: one score per choice from its pooled vector, a softmax over a question's choices."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase, classification_loss
from pentad.layers.dropout import Dropout
from pentad.layers.pooling import PoolingKind, pool
from pentad.layers.soft_labels import SoftLoss, soft_label_loss
from pentad.registry import TARGETS


class ChoiceTargetConfig(TargetConfigBase):
    type: Literal["choice"] = "choice"
    pooling: PoolingKind = "first"
    pooler: bool = Field(True, description="dense + tanh after pooling (BERT's pooler)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)


@TARGETS.register("choice")
class ChoiceTarget(Target):
    """hidden [B*G,S,H] (G choices per question, ``Batch.group_padding_mask`` [B,G]) -> logits [B,G];
    labels [B] (the right choice's index).

    Each (context, question, choice) row is encoded on its own; the head scores its pooled vector
    with one linear unit, and a question's G scores are its logits. Dummy choices (padding members,
    ``group_padding_mask`` True) get the lowest finite score, so their probability is 0 and they
    never win. The head does not depend on G: a model fine-tuned on 4 choices scores 10.
    """

    Config = ChoiceTargetConfig
    requires = ("group_padding_mask",)

    def __init__(self, name: str, hidden_size: int, pooling: PoolingKind = "first", pooler: bool = True,
                 dropout: float = 0.1):
        super().__init__(name)
        self.pooling = pooling
        self.pooler = nn.Linear(hidden_size, hidden_size) if pooler else None
        self.dropout = Dropout(dropout)
        self.scorer = nn.Linear(hidden_size, 1)

    @classmethod
    def from_config(cls, cfg: ChoiceTargetConfig, model) -> ChoiceTarget:
        return cls(cfg.target_name, model.hidden_size, cfg.pooling, cfg.pooler, cfg.dropout)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        groups = batch.group_padding_mask
        if groups is None:
            raise ValueError("the choice head needs Batch.group_padding_mask [B, G] (which rows are a "
                             "question's choices)")
        questions, size = groups.shape
        if hidden.shape[0] != questions * size:
            raise ValueError(f"the choice head got {hidden.shape[0]} rows for {questions} questions of {size} "
                             f"choices (expected {questions * size})")
        pooled = pool(hidden, batch.padding_mask, self.pooling)
        if self.pooler is not None:
            pooled = self.pooler(pooled).tanh()
        scores = self.scorer(self.dropout(pooled)).squeeze(-1).float().view(questions, size)
        logits = scores.masked_fill(groups, torch.finfo(scores.dtype).min)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        loss, metrics = classification_loss(logits, labels)
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """Each question's distribution over its real choices (dummy choices left out)."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        groups = batch.group_padding_mask
        return soft_label_loss(student.logits, teacher.logits, temperature, kind,
                               entries=None if groups is None else ~groups)
