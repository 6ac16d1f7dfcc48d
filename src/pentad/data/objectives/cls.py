"""Sentence(-pair) classification: ``[CLS] a [SEP] (b [SEP])`` with a label.

The same objective serves ``preprocess`` (a labelled TSV corpus streamed into shards, with the
label map stored in the manifest) and fine-tuning/inference, which build instances in memory with
:func:`pentad.data.tsv.encode_classification` and batch them with ``collate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, segments_from_split, to_batch_tensor
from pentad.data.shards import Instances
from pentad.data.tsv import TsvRow, assemble_pairs, parse_header, split_row
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class ClsObjectiveConfig(ObjectiveConfig):
    type: Literal["cls"] = "cls"


@OBJECTIVES.register("cls")
class ClsObjective(Objective):
    """Labelled text (pairs) -> tokens, segments, padding_mask, labels.cls."""

    Config = ClsObjectiveConfig
    truncation_refused: ClassVar[str | None] = (
        "labels.cls is one label of the whole text (or text pair), and a shorter length would keep it for text "
        "it cut away")
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.cls"})
    corpus_format: ClassVar[str] = ("TSV (UTF-8) with a header line 'label<TAB>text_a' or "
                                    "'label<TAB>text_a<TAB>text_b', then one example per line")
    field_names: ClassVar[tuple[str, ...]] = ("split", "label")

    def __init__(self, cfg: ClsObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        """The header gives the column order; it is consumed."""
        return parse_header(first_line, path, with_labels=True), True

    def parse_line(self, text: str, context: Any) -> TsvRow:
        return split_row(text, context, line=0)

    def build(self, items: list[TsvRow], rng: np.random.Generator) -> Instances:
        """Instances with raw string labels; the preprocess writer turns them into ids."""
        first = self.tokenizer.encode_batch([r.text_a for r in items])
        pairs = bool(items) and items[0].text_b is not None
        second = self.tokenizer.encode_batch([r.text_b or "" for r in items]) if pairs else None
        sequences, splits = assemble_pairs(first, second, self.cls_id, self.sep_id,
                                           self.seq_length)
        instances = Instances.from_sequences(sequences, split=splits)
        instances.labels = [r.label or "" for r in items]
        return instances

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S]; labels.cls [B] when the instances have labels."""
        ids, valid = instances.padded(self.pad_id)
        labels = {}
        if "label" in instances.fields:
            labels["cls"] = to_batch_tensor(instances.fields["label"].astype(np.int64))
        return new_batch(tokens=to_batch_tensor(ids),
                         segments=to_batch_tensor(segments_from_split(instances.fields["split"], valid)),
                         padding_mask=to_batch_tensor(~valid), labels=labels)
