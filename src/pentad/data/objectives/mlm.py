"""Masked language modelling on whole documents (RoBERTa style, no next-sentence task).

Without ``pack`` every document is cut into pieces of ``seq_length - 2`` tokens, each stored as
``[CLS] piece [SEP]``. With ``pack`` the documents are joined as ``[CLS] doc [SEP] [CLS] doc
[SEP] ...`` and cut into windows of ``seq_length`` across document boundaries (RoBERTa's
FULL-SENTENCES, TencentPretrain's ``--full_sentences``); only the corpus's last window is short.
Empty lines carry no text and make no instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.masking import MASKING_COLLATE_OPTIONS, Masker, MaskingOptions
from pentad.data.objectives.base import MaskingObjectiveConfig, Objective, new_batch, to_batch_tensor
from pentad.data.shards import Instances, concat_ranges
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class MlmObjectiveConfig(MaskingObjectiveConfig, MaskingOptions):
    type: Literal["mlm"] = "mlm"
    pack: bool = Field(False, description="Pack documents into full windows across document "
                                          "boundaries (RoBERTa FULL-SENTENCES).")


@OBJECTIVES.register("mlm")
class MlmObjective(Objective):
    """Documents -> masked sequences; provides tokens, segments (all 0), padding_mask, labels.mlm."""

    Config = MlmObjectiveConfig
    truncation_refused: ClassVar[str | None] = None  # labels.mlm: one per position
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.mlm"})
    corpus_format: ClassVar[str] = "one document per line (UTF-8 text)"
    collate_options: ClassVar[frozenset[str]] = MASKING_COLLATE_OPTIONS

    def __init__(self, cfg: MlmObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: MlmObjectiveConfig = cfg
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.masker = Masker.from_config(tokenizer, cfg)
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    @property
    def packs(self) -> bool:
        return self.cfg.pack

    def build(self, items: list[str], rng: np.random.Generator) -> Instances | np.ndarray:
        documents = [np.asarray(ids, dtype=np.int64)
                     for ids in self.tokenizer.encode_batch(items) if len(ids)]
        if self.cfg.pack:
            parts = [np.concatenate([[self.cls_id], d, [self.sep_id]]) for d in documents]
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return self._pieces(documents)

    def _pieces(self, documents: list[np.ndarray]) -> Instances:
        """Every document cut into ``[CLS] piece [SEP]`` instances, vectorised over the chunk."""
        size = self.seq_length - 2
        if not documents:
            return Instances.from_sequences([])
        text = np.concatenate(documents)
        doc_lengths = np.array([len(d) for d in documents], dtype=np.int64)
        doc_starts = np.cumsum(doc_lengths) - doc_lengths
        pieces_per_doc = -(-doc_lengths // size)
        piece_doc = np.repeat(np.arange(len(documents)), pieces_per_doc)
        piece_rank = np.arange(len(piece_doc)) - np.repeat(np.cumsum(pieces_per_doc)
                                                            - pieces_per_doc, pieces_per_doc)
        piece_start = doc_starts[piece_doc] + piece_rank * size
        piece_len = np.minimum(size, doc_lengths[piece_doc] - piece_rank * size)
        lengths = piece_len + 2
        tokens = np.empty(int(lengths.sum()), dtype=np.int64)
        ends = np.cumsum(lengths)
        tokens[ends - lengths] = self.cls_id
        tokens[ends - 1] = self.sep_id
        tokens[concat_ranges(ends - lengths + 1, piece_len)] = text[concat_ranges(piece_start,
                                                                                  piece_len)]
        return Instances(tokens, lengths)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S] and labels.mlm [B,S] (IGNORE_INDEX where unmasked)."""
        ids, valid = instances.padded(self.pad_id)
        inputs, labels = self.masker(ids, valid, rng)
        return new_batch(tokens=to_batch_tensor(inputs),
                         segments=to_batch_tensor(np.zeros_like(ids)),
                         padding_mask=to_batch_tensor(~valid),
                         labels={"mlm": to_batch_tensor(labels)})
