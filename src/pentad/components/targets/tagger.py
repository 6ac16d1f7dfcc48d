"""Token classification head (NER, POS tagging): dropout -> one linear classifier per position."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import IGNORE_INDEX, Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase
from pentad.registry import TARGETS


class TaggerTargetConfig(TargetConfigBase):
    type: Literal["tagger"] = "tagger"
    num_labels: int | None = Field(None, ge=2, description="set by the task from its tag set")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)

    def check(self, model) -> list[tuple[str, str]]:
        if self.num_labels is None:
            return [("num_labels", "the number of tags is not set (a ner task sets it from its training data; "
                                   "set it yourself to build the head alone)")]
        return []


@TARGETS.register("tagger")
class TaggerTarget(Target):
    """hidden [B,S,H] -> logits [B,S,num_labels]; labels [B,S] with IGNORE_INDEX at positions that
    are not scored (padding, [CLS]/[SEP], the continuation pieces of a word).

    Parameter names follow Hugging Face's ``*ForTokenClassification`` (``classifier``), so the
    conversion rule is one line.
    """

    Config = TaggerTargetConfig

    def __init__(self, name: str, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__(name)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)

    @classmethod
    def from_config(cls, cfg: TaggerTargetConfig, model) -> TaggerTarget:
        return cls(cfg.target_name, model.hidden_size, cfg.num_labels or 2, cfg.dropout)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.classifier(self.dropout(hidden))
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        scored = labels != IGNORE_INDEX
        # Mean over scored positions; a batch with none (all words truncated away) gives loss 0
        # with a gradient path, instead of cross-entropy's NaN.
        flat = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
        count = scored.sum()
        loss = flat / count.clamp(min=1)
        with torch.no_grad():
            correct = ((logits.argmax(dim=-1) == labels) & scored).sum()
        return TargetOutput(loss=loss, metrics={"correct": correct, "count": count}, logits=logits)
