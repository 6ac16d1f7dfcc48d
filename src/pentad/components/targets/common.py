"""Pieces shared by target heads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pentad.config.base import StrictModel


class TargetConfigBase(StrictModel):
    """Fields every target config has. ``name`` is the key of its labels and of its parameters
    (``targets.<name>.*``); it defaults to the target's type."""

    name: str | None = Field(None, description="key in batch.labels and parameter prefix; default: type")
    streams: list[str] | None = Field(None, description="the model.streams this target reads: a pair target two "
                                      "(default: both, first to second), another the first (docs/streams.md)")
    init: Literal["model", "torch"] = Field(
        "model", description="how the head's own layers start when they are not loaded: model, the model's "
        "initialisation (model.init: N(0, init_std) weights, zero biases); torch, torch's default for each layer "
        "(a Linear's weights and biases uniform within +-1/sqrt(fan_in)), as TencentPretrain's fine-tuning heads "
        "start")
    if TYPE_CHECKING:  # declared by each target as the Literal of its registered name
        type: str

    @property
    def target_name(self) -> str:
        return self.name or self.type


SMOOTHING_SPREAD_HELP = ("how label_smoothing spreads its mass: all (torch's: eps/V on every class, the true one "
                         "included) or others (fairseq's and TencentPretrain's: eps/(V-1) on each wrong class, the "
                         "true one keeps 1 - eps)")


def spread_smoothing(label_smoothing: float, spread: str, classes: int) -> float:
    """The ``label_smoothing`` torch's cross-entropy takes for ``label_smoothing`` spread over ``spread``
    classes: itself for ``all``; for ``others`` eps * V / (V - 1), which puts eps / (V - 1) on each
    wrong class and 1 - eps on the true one, as fairseq's and TencentPretrain's smoothed loss does."""
    if spread == "others" and classes > 1:
        return label_smoothing * classes / (classes - 1)
    return label_smoothing


def classification_loss(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0
                        ) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy over [N, C] logits and [N] class ids, or [N, C] target distributions (float: mixup
    and CutMix targets; correct then means the argmax is the target's heaviest class), with
    correct/count metrics as tensors."""
    loss = F.cross_entropy(logits.float(), labels.float() if labels.is_floating_point() else labels,
                           label_smoothing=label_smoothing)
    with torch.no_grad():
        classes = labels.argmax(dim=-1) if labels.is_floating_point() else labels
        correct = (logits.argmax(dim=-1) == classes).sum()
    return loss, {"correct": correct, "count": torch.tensor(classes.numel(), device=labels.device)}
