"""Bidirectional language modelling (ELMo): predict the next token forwards and the previous one
backwards.

Corpus: one document per line (blank lines carry no text and make no instance). Each document
is framed as ``[BOS] doc [EOS]`` (``[CLS] doc [SEP]`` with BERT vocabularies) and, unlike ``lm``,
never packed with other documents, so neither direction predicts across a document boundary.
A document longer than ``seq_length`` is cut into windows of ``seq_length`` tokens that overlap
by one token: every pair of neighbouring tokens then lies inside exactly one window, so each
forward and each backward prediction of the document is made exactly once (a final leftover of
one token, whose pairs are all covered, makes no window).

``labels["bilm"]`` is [B,S,2]: ``[..., 0]`` the next token, ``[..., 1]`` the previous token,
IGNORE_INDEX where there is none (last / first position of a window) and at padding.
The work is a fixed number of vectorised passes per chunk and batch: nothing loops on lines,
so blank lines and chunk or shard ends cannot stall it (TencentPretrain's could).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor, windows
from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class BilmObjectiveConfig(ObjectiveConfig):
    type: Literal["bilm"] = "bilm"


@OBJECTIVES.register("bilm")
class BilmObjective(Objective):
    """Documents -> windows with forward and backward next-token labels."""

    Config = BilmObjectiveConfig
    truncation_refused: ClassVar[str | None] = None  # labels.bilm: next and previous token per position
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "padding_mask", "labels.bilm"})
    corpus_format: ClassVar[str] = "one document per line (UTF-8 text)"
    collate_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: BilmObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id
        end = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        self.require_ids(**{"a start token (BOS or [CLS])": start,
                            "an end token (EOS or [SEP])": end})
        self.start_id, self.end_id = int(start), int(end)
        if self.seq_length < 2:
            raise UserError("objective 'bilm' needs seq_length >= 2.")

    def build(self, items: list[str], rng: np.random.Generator) -> Instances:
        parts = []
        for ids in self.tokenizer.encode_batch(items):
            if len(ids):
                framed = np.asarray([self.start_id, *ids, self.end_id], dtype=np.int64)
                parts.append(windows(framed, self.seq_length, self.seq_length - 1, final=True)[0])
        return Instances.concat(parts)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S]; labels.bilm [B,S,2] (next token, previous token)."""
        from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

        ids, valid = instances.padded(self.pad_id)
        labels = np.full(ids.shape + (2,), IGNORE_INDEX, dtype=np.int64)
        # Right padding: token j+1 is real only if token j is, so valid[:, 1:] covers both.
        labels[:, :-1, 0] = np.where(valid[:, 1:], ids[:, 1:], IGNORE_INDEX)
        labels[:, 1:, 1] = np.where(valid[:, 1:], ids[:, :-1], IGNORE_INDEX)
        return new_batch(tokens=to_batch_tensor(ids), padding_mask=to_batch_tensor(~valid),
                         labels={"bilm": to_batch_tensor(labels)})
