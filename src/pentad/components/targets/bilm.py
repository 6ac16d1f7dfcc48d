"""Bidirectional language modelling head (ELMo, Peters et al. 2018).

The hidden state [B,S,H] is read as two halves: the first H/2 features (a forward stream, which has
seen tokens <= t) predict the next token, the last H/2 (a backward stream, tokens >= t) predict the
previous one. Both directions share one output projection ``output`` [V, H/2], as in ELMo and
TencentPretrain's ``bilm`` target. Pair it with an encoder whose halves are one-way streams
(``bilstm``, ``bigru``, ``birnn``); over a bidirectional encoder the task would be trivial.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import IGNORE_INDEX, Batch, Target, TargetOutput
from pentad.components.targets.common import SMOOTHING_SPREAD_HELP, TargetConfigBase, spread_smoothing
from pentad.layers.cross_entropy import linear_cross_entropy
from pentad.registry import TARGETS


class BilmTargetConfig(TargetConfigBase):
    type: Literal["bilm"] = "bilm"
    bias: bool = Field(False, description="bias on the vocabulary projection")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    label_smoothing_spread: Literal["all", "others"] = Field("all", description=SMOOTHING_SPREAD_HELP)

    def check(self, model: Any) -> list[tuple[str, str]]:
        """Problems that need the model-level sizes: (sub-path, message)."""
        if model.hidden_size % 2:
            return [("type", f"hidden_size {model.hidden_size} is odd; the bilm target splits the hidden "
                             "state into a forward and a backward half")]
        return []


@TARGETS.register("bilm")
class BilmTarget(Target):
    """labels [B,S,2] long: ``[..., 0]`` the next token (forward), ``[..., 1]`` the previous token
    (backward), IGNORE_INDEX where nothing is scored.

    Loss: the mean of the two directions' mean token cross-entropies. Metrics ``correct`` and
    ``count`` add up both directions. Without labels: logits [B,S,2,V] (forward, backward).
    """

    Config = BilmTargetConfig

    def __init__(self, name: str, hidden_size: int, vocab_size: int, bias: bool = False,
                 label_smoothing: float = 0.0):
        super().__init__(name)
        if hidden_size % 2:
            raise ValueError(f"hidden_size {hidden_size} must be even (forward and backward halves)")
        self.half = hidden_size // 2
        self.output = nn.Linear(self.half, vocab_size, bias=bias)
        self.label_smoothing = label_smoothing

    @classmethod
    def from_config(cls, cfg: BilmTargetConfig, model: Any) -> BilmTarget:
        smoothing = spread_smoothing(cfg.label_smoothing, cfg.label_smoothing_spread, model.vocab_size)
        return cls(cfg.target_name, model.hidden_size, model.vocab_size, cfg.bias, smoothing)

    def tie_to(self, weight: nn.Parameter) -> bool:
        """Tie only when the word table is [V, H/2] (embedding width = half the hidden size)."""
        if tuple(weight.shape) != tuple(self.output.weight.shape):
            return False
        self.output.weight = weight
        return True

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        """hidden [B,S,H] -> TargetOutput (loss, correct, count), or logits [B,S,2,V] without labels."""
        forward_half, backward_half = hidden[..., : self.half], hidden[..., self.half:]
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=torch.stack(
                [self.output(forward_half), self.output(backward_half)], dim=2))
        if labels.dim() != 3 or labels.shape[-1] != 2:
            raise ValueError(f"bilm labels must be [B,S,2] (next token, previous token); got "
                             f"{tuple(labels.shape)}")
        losses, correct, count = [], [], []
        for half, direction_labels in ((forward_half, labels[..., 0]), (backward_half, labels[..., 1])):
            if hidden.device.type == "cpu":
                # As in the lm target: drop unscored positions before the vocabulary projection
                # (free on a CPU; on an accelerator it would synchronise with the host).
                selected = direction_labels != IGNORE_INDEX
                rows, targets = half[selected], direction_labels[selected]
            else:
                rows, targets = half.flatten(0, 1), direction_labels.flatten()
            loss, right, n = linear_cross_entropy(rows, self.output.weight, self.output.bias, targets,
                                                  self.label_smoothing)
            losses.append(loss)
            correct.append(right)
            count.append(n)
        return TargetOutput(loss=(losses[0] + losses[1]) / 2,
                            metrics={"correct": correct[0] + correct[1], "count": count[0] + count[1]})
