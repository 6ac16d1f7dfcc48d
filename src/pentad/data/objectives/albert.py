"""ALBERT pre-training: masked LM plus sentence-order prediction (Lan et al. 2020, section 4.1).

Segments A and B are always two consecutive pieces of one document, gathered as for ``bert``
(sentences up to a target length, ``short_seq_prob`` of them shorter, split at a random sentence,
or inside the sentence when the chunk is a single sentence); with probability 1/2 they are
swapped. ``labels.sop`` is 0 when A comes first in the document, 1 when swapped. Unlike BERT's
next-sentence task no other document is ever used, so topic gives nothing away.

A chunk that is a single one-token sentence cannot be split into two segments; it makes no
instance (as in Google's ALBERT data builder). Stored per instance: ``[CLS] A [SEP] B [SEP]``,
``split`` (first position of B) and ``sop``; masking happens in ``collate`` (with ``bert``'s
options, span masking included: ALBERT masks n-grams).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from pentad.data.objectives.base import new_batch, segments_from_split, to_batch_tensor
from pentad.data.objectives.bert import BertObjective, BertObjectiveConfig
from pentad.data.shards import Instances
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class AlbertObjectiveConfig(BertObjectiveConfig):
    type: Literal["albert"] = "albert"  # type: ignore[assignment]


@OBJECTIVES.register("albert")
class AlbertObjective(BertObjective):
    """Consecutive segment pairs, swapped half of the time; masked at collate time."""

    Config = AlbertObjectiveConfig
    truncation_refused: ClassVar[str | None] = (
        "labels.sop (sentence-order prediction) is a label of both segments' order, and a shorter length cuts "
        "the second segment away in part or whole")
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.mlm", "labels.sop"})
    field_names: ClassVar[tuple[str, ...]] = ("split", "sop")

    def build(self, items: list[str | None], rng: np.random.Generator) -> Instances:
        """As ``bert``'s build; the pair flag is the swap (stored as ``sop``)."""
        instances = super().build(items, rng)
        instances.fields["sop"] = instances.fields.pop("sp")
        return instances

    def _pairs(self, documents: list[list[int]], offsets: list[list[int]], index: int,
               rng: np.random.Generator) -> Iterator[tuple[int, int, int, int, bool]]:
        """Yield (a_start, a_len, b_start, b_len, swapped) for document ``index``: A and B are
        consecutive text, given in swapped order when ``swapped``."""
        document, offset = documents[index], offsets[index]
        target = self._target_length(rng)
        first = 0  # the current gathered chunk is sentences first..i
        size = 0
        for i in range(len(document)):
            size += document[i]
            if i < len(document) - 1 and size < target:
                continue
            count = i - first + 1
            start, end = offset[first], offset[i + 1]
            if count >= 2:
                cut = offset[first + int(rng.integers(1, count))]
            elif end - start >= 2:
                cut = start + int(rng.integers(1, end - start))
            else:
                cut = None  # a one-token chunk cannot be split
            if cut is not None:
                a_start, a_len, b_start, b_len = self._truncate(start, cut - start, cut, end - cut, rng)
                if rng.random() < 0.5:
                    yield b_start, b_len, a_start, a_len, True
                else:
                    yield a_start, a_len, b_start, b_len, False
            first, size = i + 1, 0
            target = self._target_length(rng)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S], labels.mlm [B,S], labels.sop [B] (1 = swapped)."""
        ids, valid = instances.padded(self.pad_id)
        inputs, mlm = self.masker(ids, valid, rng)
        return new_batch(tokens=to_batch_tensor(inputs),
                         segments=to_batch_tensor(segments_from_split(instances.fields["split"], valid)),
                         padding_mask=to_batch_tensor(~valid),
                         labels={"mlm": to_batch_tensor(mlm),
                                 "sop": to_batch_tensor(instances.fields["sop"].astype(np.int64))})
