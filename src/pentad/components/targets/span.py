"""Span-extraction head (extractive QA): one linear layer scores every position as an answer's start
and as its end."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pentad.components.base import Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.soft_labels import SoftLoss, soft_label_loss
from pentad.registry import TARGETS


class SpanTargetConfig(TargetConfigBase):
    type: Literal["span"] = "span"


@TARGETS.register("span")
class SpanTarget(Target):
    """hidden [B,S,H] -> logits [B,S,2] (``[..., 0]`` start scores, ``[..., 1]`` end scores); labels
    [B,2]: the start and end positions of the answer in each row (0, the first token, when the row
    holds no answer). Padding positions score the lowest value, so they are never chosen.

    The loss is the mean of the start and the end cross-entropies over the positions of each row,
    averaged over the rows (as BERT's SQuAD head and TencentPretrain's ``run_cmrc``). The parameter
    name follows Hugging Face's ``*ForQuestionAnswering`` (``qa_outputs``).
    """

    Config = SpanTargetConfig

    def __init__(self, name: str, hidden_size: int):
        super().__init__(name)
        self.qa_outputs = nn.Linear(hidden_size, 2)

    @classmethod
    def from_config(cls, cfg: SpanTargetConfig, model) -> SpanTarget:
        return cls(cfg.target_name, model.hidden_size)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.qa_outputs(hidden).float()
        if batch.padding_mask is not None:
            logits = logits.masked_fill(batch.padding_mask.unsqueeze(-1), torch.finfo(logits.dtype).min)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        start, end = logits[..., 0], logits[..., 1]
        loss = (F.cross_entropy(start, labels[:, 0]) + F.cross_entropy(end, labels[:, 1])) / 2
        with torch.no_grad():
            correct = ((start.argmax(dim=-1) == labels[:, 0]) & (end.argmax(dim=-1) == labels[:, 1])).sum()
        return TargetOutput(loss=loss, metrics={"correct": correct,
                                                "count": torch.tensor(labels.shape[0], device=labels.device)},
                            logits=logits)

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """The start and the end distributions over each row's positions (padding left out), the mean of
        their soft-label losses, averaged over rows like the head's own loss."""
        if student.logits is None or teacher is None or teacher.logits is None:
            return None
        real = None if batch.padding_mask is None else ~batch.padding_mask
        s, t = student.logits, teacher.logits
        return (soft_label_loss(s[..., 0], t[..., 0], temperature, kind, entries=real)
                + soft_label_loss(s[..., 1], t[..., 1], temperature, kind, entries=real)) / 2
