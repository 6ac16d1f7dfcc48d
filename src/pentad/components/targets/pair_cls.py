"""Sentence-pair classification over the two pooled streams of a two-stream model.

The features of a pair (u, v) are concatenated from ``u``, ``v``, ``abs_diff`` = |u - v| and
``product`` = u * v, then an optional hidden layer (tanh) and a linear classifier. SBERT's
classification objective uses (u, v, |u-v|) and a softmax classifier (Reimers & Gurevych 2019,
section 3); InferSent adds u * v and a hidden layer of 512 units (Conneau et al. 2017, section
3.1); TencentPretrain's ``run_classifier_siamese.py`` uses all four features and a linear layer.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, PooledPair, Target, TargetOutput
from pentad.components.stream import pair_widths
from pentad.components.targets.common import TargetConfigBase, classification_loss
from pentad.layers.dropout import Dropout
from pentad.registry import TARGETS

PairFeature = Literal["u", "v", "abs_diff", "product"]


class PairClsTargetConfig(TargetConfigBase):
    type: Literal["pair_cls"] = "pair_cls"
    num_labels: int | None = Field(None, ge=2, description="set by the task from its label set")
    features: list[PairFeature] = Field(["u", "v", "abs_diff"], min_length=1, description="concatenated "
                                        "pair features: u, v, abs_diff (|u-v|), product (u*v)")
    mlp_size: int | None = Field(None, ge=1, description="width of one hidden layer (tanh) before the "
                                 "classifier (InferSent: 512); none: a linear classifier (SBERT)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout on the features (and hidden layer)")

    def check(self, model) -> list[tuple[str, str]]:
        problems = []
        if self.num_labels is None:
            problems.append(("num_labels", "the number of labels is not set (a classification task sets it "
                                           "from its training data; set it yourself to build the head alone)"))
        if len(set(self.features)) != len(self.features):
            problems.append(("features", f"a feature appears twice in {self.features}"))
        widths = pair_widths(model, self)
        if widths[0] != widths[1] and {"abs_diff", "product"} & set(self.features):
            problems.append(("features", f"abs_diff and product need streams of one width; the streams are "
                                         f"{widths[0]} and {widths[1]} wide"))
        return problems


@TARGETS.register("pair_cls")
class PairClsTarget(Target):
    """PooledPair (u [B,H0], v [B,H1]) -> logits [B, num_labels]; labels [B]."""

    Config = PairClsTargetConfig
    reads_pair = True

    def __init__(self, name: str, widths: tuple[int, int], num_labels: int,
                 features: tuple[str, ...] = ("u", "v", "abs_diff"), mlp_size: int | None = None,
                 dropout: float = 0.1):
        super().__init__(name)
        if widths[0] != widths[1] and {"abs_diff", "product"} & set(features):
            raise ValueError(f"features {features} need streams of one width, got {widths}")
        self.features = tuple(features)
        size = {"u": widths[0], "v": widths[1], "abs_diff": widths[0], "product": widths[0]}
        width = sum(size[f] for f in self.features)
        self.dropout = Dropout(dropout)
        self.hidden = nn.Linear(width, mlp_size) if mlp_size else None
        self.classifier = nn.Linear(mlp_size or width, num_labels)

    @classmethod
    def from_config(cls, cfg: PairClsTargetConfig, model) -> PairClsTarget:
        return cls(cfg.target_name, pair_widths(model, cfg), cfg.num_labels or 2, tuple(cfg.features), cfg.mlp_size,
                   cfg.dropout)

    def pair_features(self, pooled: PooledPair) -> Tensor:
        """[B, F]: the configured features of (u, v), concatenated in order."""
        u, v = pooled.first, pooled.second
        parts = {"u": lambda: u, "v": lambda: v, "abs_diff": lambda: (u - v).abs(), "product": lambda: u * v}
        return torch.cat([parts[f]() for f in self.features], dim=-1)

    def forward(self, hidden: PooledPair, batch: Batch) -> TargetOutput:  # type: ignore[override]
        x = self.dropout(self.pair_features(hidden))
        if self.hidden is not None:
            x = self.dropout(self.hidden(x).tanh())
        logits = self.classifier(x)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        loss, metrics = classification_loss(logits, labels)
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)
