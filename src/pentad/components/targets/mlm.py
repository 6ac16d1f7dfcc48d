"""Masked language modelling head (BERT): dense -> activation -> LayerNorm -> vocabulary."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, Target, TargetOutput
from pentad.components.norms import make_norm, norm_description, norm_kinds
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.activations import ACTIVATION_NAMES, get_activation
from pentad.layers.cross_entropy import linear_cross_entropy, scored_rows
from pentad.registry import TARGETS


class MlmTargetConfig(TargetConfigBase):
    type: Literal["mlm"] = "mlm"
    activation: Literal[ACTIVATION_NAMES] = "gelu"  # type: ignore[valid-type]
    norm: Literal[norm_kinds()] = Field(  # type: ignore[valid-type]
        "layernorm", description=f"the head's norm: {norm_description()}")
    layer_norm_eps: float = Field(1e-12, gt=0.0)


@TARGETS.register("mlm")
class MlmTarget(Target):
    """Scores masked positions only: the masked hidden states are gathered *before* the vocabulary
    projection, which at small widths is most of the model's compute (DESIGN section 7).

    labels [B,S] with IGNORE_INDEX at unmasked positions. Without labels: logits [B,S,V].
    """

    Config = MlmTargetConfig

    def __init__(self, name: str, hidden_size: int, vocab_size: int, activation: str = "gelu",
                 layer_norm_eps: float = 1e-12, embedding_size: int | None = None, norm: str = "layernorm"):
        super().__init__(name)
        width = embedding_size or hidden_size  # ALBERT: the head maps back to the embedding width
        self.dense = nn.Linear(hidden_size, width)
        self.act = get_activation(activation)
        self.norm = make_norm(norm, width, layer_norm_eps)
        self.output = nn.Linear(width, vocab_size)

    @classmethod
    def from_config(cls, cfg: MlmTargetConfig, model) -> MlmTarget:
        return cls(cfg.target_name, model.hidden_size, model.vocab_size, cfg.activation, cfg.layer_norm_eps,
                   getattr(model, "embedding_size", None), norm=cfg.norm)

    def tie_to(self, weight: nn.Parameter) -> bool:
        self.output.weight = weight
        return True

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.output(self.norm(self.act(self.dense(hidden))))

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=self._logits(hidden))
        rows, scored = scored_rows(hidden, labels)  # [N, H], N = masked tokens (padded under bf16 on a CPU)
        transformed = self.norm(self.act(self.dense(rows)))
        # Vocabulary projection fused with the loss: no [N, V] logits are kept.
        loss, correct, count = linear_cross_entropy(transformed, self.output.weight, self.output.bias, scored)
        return TargetOutput(loss=loss, metrics={"correct": correct, "count": count})
