"""Prompt (cloze) classification head: the MLM head read at the mask of a template, scored over the
verbalizer's words only (PET; TencentPretrain's run_classifier_prompt).

Same modules and parameter names as ``mlm`` (dense -> activation -> norm -> vocabulary), so a
pre-trained MLM head loads into it unchanged when it carries that head's name. A label is a class
id: the logits of class ``c`` are the MLM logits of ``word_ids[c]`` at the row's first ``mask_id``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from pentad.components.base import Batch, TargetOutput
from pentad.components.targets.common import classification_loss
from pentad.components.targets.mlm import MlmTarget, MlmTargetConfig
from pentad.registry import TARGETS


class PromptTargetConfig(MlmTargetConfig):
    type: Literal["prompt"] = "prompt"  # type: ignore[assignment]
    mask_id: int | None = Field(None, ge=0, description="the token whose position is scored (set by the task)")
    word_ids: list[int] = Field(default_factory=list, description="the verbalizer's token id of each class, "
                                "in class order (set by the task)")

    def check(self, model) -> list[tuple[str, str]]:
        problems = []
        if self.mask_id is None:
            problems.append(("mask_id", "the mask token id is not set (the prompt task sets it)"))
        if len(self.word_ids) < 2:
            problems.append(("word_ids", "a prompt head needs the token ids of at least two verbalizer words "
                                         "(the prompt task sets them)"))
        return problems


@TARGETS.register("prompt")
class PromptTarget(MlmTarget):
    """hidden [B,S,H] -> logits [B, classes] at each row's mask (tokens == mask_id); labels [B] class ids."""

    Config = PromptTargetConfig
    requires = ("tokens",)

    def __init__(self, name: str, hidden_size: int, vocab_size: int, mask_id: int, word_ids: list[int],
                 **mlm_options):
        super().__init__(name, hidden_size, vocab_size, **mlm_options)
        self.mask_id = mask_id
        # not a weight: the checkpoint of a pre-trained MLM head has no such key
        self.register_buffer("word_ids", torch.tensor(word_ids, dtype=torch.long), persistent=False)

    @classmethod
    def from_config(cls, cfg: PromptTargetConfig, model) -> PromptTarget:
        return cls(cfg.target_name, model.hidden_size, model.vocab_size, cfg.mask_id or 0, list(cfg.word_ids),
                   activation=cfg.activation, layer_norm_eps=cfg.layer_norm_eps,
                   embedding_size=getattr(model, "embedding_size", None), norm=cfg.norm)

    def scores(self, hidden: Tensor, batch: Batch) -> Tensor:
        """The verbalizer words' logits [B, classes] at each row's first mask token."""
        at_mask = batch.tokens[:, -hidden.shape[1]:] == self.mask_id
        position = at_mask.int().argmax(dim=1)  # the task puts exactly one mask in each row
        picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), position]
        transformed = self.norm(self.act(self.dense(picked)))
        bias = self.output.bias[self.word_ids] if self.output.bias is not None else None
        return F.linear(transformed, self.output.weight[self.word_ids], bias)

    def forward(self, hidden: Tensor, batch: Batch) -> TargetOutput:
        logits = self.scores(hidden, batch)
        labels = batch.labels.get(self.name)
        if labels is None:
            return TargetOutput(loss=None, logits=logits)
        loss, metrics = classification_loss(logits, labels)
        return TargetOutput(loss=loss, metrics=metrics, logits=logits)
