"""Token classification head (NER, POS tagging): dropout -> one linear classifier per position,
optionally followed by a linear-chain CRF over the scored positions."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import IGNORE_INDEX, Batch, Target, TargetOutput
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.crf import LinearChainCRF, compact
from pentad.layers.dropout import Dropout
from pentad.registry import TARGETS


class TaggerTargetConfig(TargetConfigBase):
    type: Literal["tagger"] = "tagger"
    num_labels: int | None = Field(None, ge=2, description="set by the task from its tag set")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    crf: bool = Field(False, description="a linear-chain CRF over the scored positions (TencentPretrain's "
                      "--crf_target): trained by sequence likelihood, predicted by Viterbi")
    crf_reduction: Literal["position", "sequence"] = Field(
        "position", description="with crf: the loss is the batch's negative log-likelihood divided by its scored "
        "positions (position) or its rows (sequence: the mean per sentence, as TencentPretrain's run_ner.py "
        "takes it from pytorch-crf)")

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
    conversion rule is one line. With ``crf``, the scored positions of each row (those with a label)
    form the tag sequence: the loss is the CRF's negative log-likelihood per scored position, the
    logits stay the per-position emission scores, and ``crf.decode`` / ``crf.marginals`` predict
    (the ``ner`` task does so over each row's word starts).
    """

    Config = TaggerTargetConfig

    def __init__(self, name: str, hidden_size: int, num_labels: int, dropout: float = 0.1, crf: bool = False,
                 crf_reduction: str = "position"):
        super().__init__(name)
        self.crf_reduction = crf_reduction
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)
        self.crf = LinearChainCRF(num_labels) if crf else None

    @classmethod
    def from_config(cls, cfg: TaggerTargetConfig, model) -> TaggerTarget:
        return cls(cfg.target_name, model.hidden_size, cfg.num_labels or 2, cfg.dropout, cfg.crf, cfg.crf_reduction)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.classifier(self.dropout(hidden))
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        scored = labels != IGNORE_INDEX
        if self.crf is not None:
            return self._crf_output(logits, labels, scored)
        # Mean over scored positions; a batch with none (all words truncated away) gives loss 0
        # with a gradient path, instead of cross-entropy's NaN.
        flat = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
        count = scored.sum()
        loss = flat / count.clamp(min=1)
        with torch.no_grad():
            correct = ((logits.argmax(dim=-1) == labels) & scored).sum()
        return TargetOutput(loss=loss, metrics={"correct": correct, "count": count}, logits=logits)

    def distill_positions(self, batch: Batch) -> Tensor | None:
        """The positions with a label (those the loss scores); without labels, those that are not padding.
        With ``crf`` the soft labels compare the per-position emission scores (the CRF's transitions are
        learnt from the hard labels only)."""
        labels = batch.labels.get(self.name)
        if labels is not None:
            return labels != IGNORE_INDEX
        return None if batch.padding_mask is None else ~batch.padding_mask

    def _crf_output(self, logits: Tensor, labels: Tensor, scored: Tensor) -> TargetOutput:
        emissions, mask = compact(logits, scored)
        tags, _ = compact(labels, scored)
        count = scored.sum()
        rows = mask.any(dim=1).sum()
        # (the per-sequence mean is weighted by rows across ranks: the "weight" metric)
        loss = self.crf.nll(emissions, tags, mask).sum() / (count if self.crf_reduction == "position" else rows
                                                             ).clamp(min=1)
        with torch.no_grad():
            paths = self.crf.decode(emissions, mask)
            gold = tags.tolist()
            correct = sum(int(p == g) for path, row in zip(paths, gold) for p, g in zip(path, row))
        metrics = {"correct": torch.tensor(correct, device=logits.device), "count": count}
        if self.crf_reduction == "sequence":
            metrics["weight"] = rows
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)
