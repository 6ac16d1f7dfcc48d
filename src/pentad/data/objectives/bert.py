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

from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.components.base import Batch
from pentad.data.masking import Masker
from pentad.data.objectives.base import MaskingObjectiveConfig, Objective, segments_from_split, to_batch_tensor
from pentad.data.shards import Instances
from pentad.data.tsv import fit_pair
from pentad.registry import OBJECTIVES

# How often to draw another document for a random next before accepting the current one.
RANDOM_DOCUMENT_TRIES = 10


class BertObjectiveConfig(MaskingObjectiveConfig):
    type: Literal["bert"] = "bert"
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0,
                                  description="Probability of a shorter random target length.")


@OBJECTIVES.register("bert")
class BertObjective(Objective):
    """Sentence pairs with next-sentence labels; masked at collate time."""

    Config = BertObjectiveConfig
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.mlm", "labels.sp"})
    corpus_format: ClassVar[str] = ("one sentence per line, documents separated by a blank line "
                                    "(UTF-8 text)")
    field_names: ClassVar[tuple[str, ...]] = ("split", "sp")
    documents_end_at_blank_lines: ClassVar[bool] = True

    def __init__(self, cfg: BertObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: BertObjectiveConfig = cfg
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.masker = Masker(tokenizer, cfg.mask_prob, cfg.whole_word_masking)
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    def parse_line(self, text: str, context: Any) -> str | None:
        """A sentence, or None for a blank line (end of document)."""
        return text if text.strip() else None

    def build(self, items: list[str | None], rng: np.random.Generator) -> Instances:
        sentences = [s for s in items if s is not None]
        encoded = iter(self.tokenizer.encode_batch(sentences))
        documents: list[list[np.ndarray]] = [[]]
        for item in items:
            if item is None:
                if documents[-1]:
                    documents.append([])
                continue
            ids = np.asarray(next(encoded), dtype=np.int64)
            if ids.size:
                documents[-1].append(ids)
        documents = [d for d in documents if d]
        sequences: list[np.ndarray] = []
        splits: list[int] = []
        labels: list[int] = []
        for index in range(len(documents)):
            for a, b, random_next in self._pairs(documents, index, rng):
                sequences.append(np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]]))
                splits.append(len(a) + 2)
                labels.append(int(random_next))
        return Instances.from_sequences(sequences, split=splits, sp=labels)

    def _target_length(self, rng: np.random.Generator) -> int:
        longest = self.seq_length - 3
        if rng.random() < self.cfg.short_seq_prob:
            return int(rng.integers(2, longest + 1))
        return longest

    def _pairs(self, documents: list[list[np.ndarray]], index: int, rng: np.random.Generator):
        """Yield (tokens_a, tokens_b, is_random_next) for document ``index``."""
        document = documents[index]
        target = self._target_length(rng)
        chunk: list[np.ndarray] = []
        size = 0
        i = 0
        while i < len(document):
            chunk.append(document[i])
            size += len(document[i])
            if i == len(document) - 1 or size >= target:
                a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
                a = np.concatenate(chunk[:a_end])
                random_next = rng.random() < 0.5 or (len(chunk) == 1 and len(a) < 2)
                if random_next:
                    b = self._random_next(documents, index, target - len(a), rng)
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
                elif len(chunk) == 1:
                    cut = int(rng.integers(1, len(a)))
                    a, b = a[:cut], a[cut:]
                else:
                    b = np.concatenate(chunk[a_end:])
                yield self._truncate(a, b, rng) + (random_next,)
                chunk, size = [], 0
                target = self._target_length(rng)
            i += 1

    @staticmethod
    def _random_next(documents: list[list[np.ndarray]], index: int, length: int,
                     rng: np.random.Generator) -> np.ndarray:
        other = index
        for _ in range(RANDOM_DOCUMENT_TRIES):
            other = int(rng.integers(0, len(documents)))
            if other != index:
                break
        document = documents[other]
        start = int(rng.integers(0, len(document)))
        taken: list[np.ndarray] = []
        total = 0
        for sentence in document[start:]:
            taken.append(sentence)
            total += len(sentence)
            if total >= length:
                break
        return np.concatenate(taken)

    def _truncate(self, a: np.ndarray, b: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Trim the longer segment until the pair fits, each token from the front or the back
        with probability 1/2 (Google BERT's truncate_seq_pair, in closed form)."""
        keep_a, keep_b = fit_pair(len(a), len(b), self.seq_length - 3)
        out = []
        for seq, keep in ((a, keep_a), (b, keep_b)):
            front = int(rng.binomial(len(seq) - keep, 0.5)) if keep < len(seq) else 0
            out.append(seq[front:front + keep])
        return out[0], out[1]

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S], labels.mlm [B,S], labels.sp [B] (0 = is next)."""
        ids, valid = instances.padded(self.pad_id)
        inputs, mlm = self.masker(ids, valid, rng)
        return Batch(tokens=to_batch_tensor(inputs),
                     segments=to_batch_tensor(segments_from_split(instances.fields["split"], valid)),
                     padding_mask=to_batch_tensor(~valid),
                     labels={"mlm": to_batch_tensor(mlm),
                             "sp": to_batch_tensor(instances.fields["sp"].astype(np.int64))})
