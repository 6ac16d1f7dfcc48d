"""Language modelling head: hidden -> vocabulary, next-token cross-entropy."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import IGNORE_INDEX, Batch, Target, TargetOutput
from pentad.components.targets.common import SMOOTHING_SPREAD_HELP, TargetConfigBase, spread_smoothing
from pentad.layers.cross_entropy import linear_cross_entropy
from pentad.registry import TARGETS


class LmTargetConfig(TargetConfigBase):
    type: Literal["lm"] = "lm"
    bias: bool = Field(False, description="bias on the vocabulary projection")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    label_smoothing_spread: Literal["all", "others"] = Field("all", description=SMOOTHING_SPREAD_HELP)
    scale_hidden: bool = Field(False, description="multiply the hidden states by hidden_size^-0.5 before "
                               "the output projection (T5 with a tied output)")
    logit_softcap: float | None = Field(None, gt=0.0, description="soft-cap the logits to (-c, c): c * tanh(logits "
                                        "/ c) (Gemma 2: 30; the loss is then computed unfused); off when unset")


@TARGETS.register("lm")
class LmTarget(Target):
    """labels [B,S]: the token each position must predict (already shifted by the objective),
    IGNORE_INDEX where nothing is scored (padding, prompts). Without labels: logits [B,S,V]."""

    Config = LmTargetConfig

    def __init__(self, name: str, hidden_size: int, vocab_size: int, bias: bool = False,
                 label_smoothing: float = 0.0, scale_hidden: bool = False, logit_softcap: float | None = None):
        super().__init__(name)
        self.output = nn.Linear(hidden_size, vocab_size, bias=bias)
        self.label_smoothing = label_smoothing
        self.hidden_scale = hidden_size ** -0.5 if scale_hidden else None
        self.logit_softcap = logit_softcap

    @classmethod
    def from_config(cls, cfg: LmTargetConfig, model) -> LmTarget:
        smoothing = spread_smoothing(cfg.label_smoothing, cfg.label_smoothing_spread, model.vocab_size)
        return cls(cfg.target_name, model.hidden_size, model.vocab_size, cfg.bias, smoothing, cfg.scale_hidden,
                   cfg.logit_softcap)

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., H] -> [..., V] next-token scores (generation reads the last position's)."""
        if self.hidden_scale is not None:
            hidden = hidden * self.hidden_scale
        logits = self.output(hidden)
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def tie_to(self, weight: nn.Parameter) -> bool:
        self.output.weight = weight
        return True

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=self.logits(hidden))
        if self.hidden_scale is not None:
            hidden = hidden * self.hidden_scale
        if hidden.device.type == "cpu":
            # Skip unscored positions before the vocabulary projection; on CPU the check is free,
            # on an accelerator it would cost a host synchronisation per step.
            selected = labels != IGNORE_INDEX
            hidden, labels = hidden[selected], labels[selected]
        else:
            hidden, labels = hidden.flatten(0, 1), labels.flatten()
        # Projection and loss fused: no [N, V] logits are kept (see layers/cross_entropy.py).
        loss, correct, count = linear_cross_entropy(hidden, self.output.weight, self.output.bias, labels,
                                                    self.label_smoothing, self.logit_softcap)
        return TargetOutput(loss=loss, metrics={"correct": correct, "count": count})
