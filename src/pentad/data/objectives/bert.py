"""BERT pre-training: masked LM plus next-sentence prediction on sentence pairs.

Instances follow Google BERT's ``create_instances_from_document`` (also TencentPretrain's
BertDataset): sentences of a document are gathered until a target length (the full
``seq_length - 3`` or, with probability ``short_seq_prob``, a random shorter one), split into
segment A and B at a random sentence, and half of the time B is replaced by sentences from a
random other document. Two deliberate differences: the short target length is redrawn for every
instance rather than once per document, and a gathered chunk of a single sentence is split inside
the sentence when B should be the true continuation (Google always makes it a random next, which
pushes the label balance away from 50% on corpora with long lines).

Stored per instance: ``[CLS] A [SEP] B [SEP]``, ``split`` (first position of segment B) and
``sp`` (0 = B is the next text, 1 = B is random). Masking happens in ``collate``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.masking import MASKING_COLLATE_OPTIONS, Masker, MaskingOptions
from pentad.data.objectives.base import (
    MaskingObjectiveConfig,
    Objective,
    new_batch,
    segments_from_split,
    to_batch_tensor,
)
from pentad.data.shards import Instances, concat_ranges
from pentad.data.tsv import fit_pair
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

# How often to draw another document for a random next before accepting the current one.
RANDOM_DOCUMENT_TRIES = 10


class BertObjectiveConfig(MaskingObjectiveConfig, MaskingOptions):
    type: Literal["bert"] = "bert"
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0,
                                  description="Probability of a shorter random target length.")


@OBJECTIVES.register("bert")
class BertObjective(Objective):
    """Sentence pairs with next-sentence labels; masked at collate time."""

    Config = BertObjectiveConfig
    truncation_refused: ClassVar[str | None] = (
        "labels.sp (next-sentence prediction) is a label of the second segment, which a shorter length cuts "
        "away in part or whole")
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.mlm", "labels.sp"})
    corpus_format: ClassVar[str] = ("one sentence per line, documents separated by a blank line "
                                    "(UTF-8 text)")
    field_names: ClassVar[tuple[str, ...]] = ("split", "sp")
    collate_options: ClassVar[frozenset[str]] = MASKING_COLLATE_OPTIONS
    documents_end_at_blank_lines: ClassVar[bool] = True

    def __init__(self, cfg: BertObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: BertObjectiveConfig = cfg
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.masker = Masker.from_config(tokenizer, cfg)
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    def parse_line(self, text: str, context: Any) -> str | None:
        """A sentence, or None for a blank line (end of document)."""
        return text if text.strip() else None

    def build(self, items: list[str | None], rng: np.random.Generator) -> Instances:
        """A chunk's lines -> ``[CLS] A [SEP] B [SEP]`` instances with ``split`` and ``sp``.

        The sentences are tokenized in one batch and laid end to end in one flat id array, in
        corpus order. A, B (true or random next) and their truncations are then each one
        contiguous span of that array, so instances are planned with integers alone and
        gathered in one vectorised pass at the end (no small per-sentence arrays).
        """
        encoded = self.tokenizer.encode_batch([s for s in items if s is not None])
        lengths = [len(ids) for ids in encoded]
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64,
                           count=sum(lengths))
        # Per document: the lengths of its non-empty sentences and where its first one starts.
        documents: list[list[int]] = [[]]
        doc_starts: list[int] = [0]
        position = 0
        sizes = iter(lengths)
        for item in items:
            if item is None:
                if documents[-1]:
                    documents.append([])
                    doc_starts.append(0)
                continue
            size = next(sizes)
            if size:
                if not documents[-1]:
                    doc_starts[-1] = position
                documents[-1].append(size)
                position += size
        if not documents[-1]:
            documents.pop()
            doc_starts.pop()
        # offsets[d][k]: position in ``flat`` of sentence k of document d (and its end at k = len).
        offsets = [list(itertools.accumulate(d, initial=s)) for d, s in zip(documents, doc_starts)]
        spans: list[tuple[int, int, int, int, bool]] = []
        for index in range(len(documents)):
            spans.extend(self._pairs(documents, offsets, index, rng))
        if not spans:
            return Instances.from_sequences([], split=[], sp=[])
        a_start, a_len, b_start, b_len, random_next = (np.array(c, dtype=np.int64) for c in zip(*spans))
        sizes_out = a_len + b_len + 3
        ends = np.cumsum(sizes_out)
        begins = ends - sizes_out
        tokens = np.empty(int(ends[-1]), dtype=np.int64)
        tokens[begins] = self.cls_id
        tokens[begins + 1 + a_len] = self.sep_id
        tokens[ends - 1] = self.sep_id
        tokens[concat_ranges(begins + 1, a_len)] = flat[concat_ranges(a_start, a_len)]
        tokens[concat_ranges(begins + 2 + a_len, b_len)] = flat[concat_ranges(b_start, b_len)]
        return Instances(tokens, sizes_out, {"split": a_len + 2, "sp": random_next})

    def _target_length(self, rng: np.random.Generator) -> int:
        longest = self.seq_length - 3
        # seq_length 4 leaves no room for a shorter target (the draw below needs longest >= 2).
        if rng.random() < self.cfg.short_seq_prob and longest >= 2:
            return int(rng.integers(2, longest + 1))
        return longest

    def _pairs(self, documents: list[list[int]], offsets: list[list[int]], index: int,
               rng: np.random.Generator) -> Iterator[tuple[int, int, int, int, bool]]:
        """Yield (a_start, a_len, b_start, b_len, is_random_next) for document ``index``.

        ``documents[d]`` holds the token counts of document d's sentences and ``offsets[d]``
        their positions in the chunk's flat id array (see ``build``).
        """
        document, offset = documents[index], offsets[index]
        target = self._target_length(rng)
        first = 0  # the current gathered chunk is sentences first..i
        size = 0
        i = 0
        while i < len(document):
            size += document[i]
            if i == len(document) - 1 or size >= target:
                count = i - first + 1
                a_end = first + (int(rng.integers(1, count)) if count >= 2 else 1)
                a_start, a_len = offset[first], offset[a_end] - offset[first]
                random_next = rng.random() < 0.5 or (count == 1 and a_len < 2)
                if random_next:
                    b_start, b_len = self._random_next(documents, offsets, index, target - a_len, rng)
                    i = a_end - 1  # the unused sentences start the next chunk
                elif count == 1:
                    cut = int(rng.integers(1, a_len))
                    a_len, b_start, b_len = cut, a_start + cut, a_len - cut
                else:
                    b_start, b_len = offset[a_end], offset[i + 1] - offset[a_end]
                yield self._truncate(a_start, a_len, b_start, b_len, rng) + (random_next,)
                first, size = i + 1, 0
                target = self._target_length(rng)
            i += 1

    @staticmethod
    def _random_next(documents: list[list[int]], offsets: list[list[int]], index: int,
                     length: int, rng: np.random.Generator) -> tuple[int, int]:
        """(start, length) of sentences of a random other document, from a random sentence on,
        until they hold at least ``length`` tokens (or the document ends)."""
        other = index
        for _ in range(RANDOM_DOCUMENT_TRIES):
            other = int(rng.integers(0, len(documents)))
            if other != index:
                break
        document = documents[other]
        start = int(rng.integers(0, len(document)))
        total = 0
        for size in document[start:]:
            total += size
            if total >= length:
                break
        return offsets[other][start], total

    def _truncate(self, a_start: int, a_len: int, b_start: int, b_len: int,
                  rng: np.random.Generator) -> tuple[int, int, int, int]:
        """Trim the longer segment until the pair fits, each token from the front or the back
        with probability 1/2 (Google BERT's truncate_seq_pair, in closed form)."""
        keep_a, keep_b = fit_pair(a_len, b_len, self.seq_length - 3)
        if keep_a < a_len:
            a_start += int(rng.binomial(a_len - keep_a, 0.5))
        if keep_b < b_len:
            b_start += int(rng.binomial(b_len - keep_b, 0.5))
        return a_start, keep_a, b_start, keep_b

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S], labels.mlm [B,S], labels.sp [B] (0 = is next)."""
        ids, valid = instances.padded(self.pad_id)
        inputs, mlm = self.masker(ids, valid, rng)
        return new_batch(tokens=to_batch_tensor(inputs),
                         segments=to_batch_tensor(segments_from_split(instances.fields["split"], valid)),
                         padding_mask=to_batch_tensor(~valid),
                         labels={"mlm": to_batch_tensor(mlm),
                                 "sp": to_batch_tensor(instances.fields["sp"].astype(np.int64))})
