"""PEGASUS gap-sentence generation (Zhang et al. 2020): generate the sentences masked out.

Corpus: the ``bert`` document format (one sentence per line, a blank line between documents).
Sentences are gathered, in order, into chunks of at most ``seq_length - 2`` tokens as for
``bart`` (longer sentences are cut into pieces that count as sentences). In each chunk of n
sentences, m = ``round(gap_sentence_ratio * n)`` of them (at least 1; at most n - 1 when n > 1,
so the source keeps some context) are selected by ``sentence_selection``:

* ``lead``: the first m sentences;
* ``random``: m sentences drawn uniformly (seeded per chunk);
* ``principal``: the m sentences with the highest ROUGE-1 F1 against the rest of the chunk,
  each scored on its own (PEGASUS's "Ind-Orig", its best strategy). Unigrams are token ids.

The source is the chunk with every selected sentence replaced by one ``[MASK]``, framed as
``[BOS] ... [EOS]``; the target is the selected sentences in document order, then EOS (see
:mod:`pentad.data.objectives.mt` for the decoder-side fields). Selection happens at
preprocessing; an instance stores the framed source then the target text, with the field
``split`` (where the target starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.objectives.bart import DOCUMENT_FORMAT, documents_of, sentence_chunks
from pentad.data.objectives.mt import Seq2SeqObjective, Seq2SeqObjectiveConfig
from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class GsgObjectiveConfig(Seq2SeqObjectiveConfig):
    type: Literal["gsg"] = "gsg"
    gap_sentence_ratio: float = Field(0.3, gt=0.0, lt=1.0,
                                      description="Fraction of each chunk's sentences to generate.")
    sentence_selection: Literal["lead", "random", "principal"] = Field(
        "principal", description="Which sentences: the first ones, random ones, or those with the "
                                 "highest ROUGE-1 F1 against the rest (PEGASUS Ind-Orig).")


@OBJECTIVES.register("gsg")
class GsgObjective(Seq2SeqObjective):
    """Documents -> (source with masked sentences, target = those sentences)."""

    Config = GsgObjectiveConfig
    corpus_format: ClassVar[str] = DOCUMENT_FORMAT
    field_names: ClassVar[tuple[str, ...]] = ("split",)
    documents_end_at_blank_lines: ClassVar[bool] = True

    def __init__(self, cfg: GsgObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: GsgObjectiveConfig = cfg
        self.require_ids(**{"[MASK]": tokenizer.mask_id})
        self.mask_id = int(tokenizer.mask_id)
        if self.source_budget < 1:
            raise UserError(f"objective 'gsg': seq_length {self.seq_length} leaves no room for "
                            f"text besides the framing tokens.")

    def parse_line(self, text: str, context: Any) -> str | None:
        """A sentence, or None for a blank line (end of document)."""
        return text if text.strip() else None

    def select(self, sentences: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        """Sorted indices of the sentences to mask out."""
        n = len(sentences)
        m = max(1, int(round(self.cfg.gap_sentence_ratio * n)))
        m = min(m, n - 1) if n > 1 else 1
        strategy = self.cfg.sentence_selection
        if strategy == "lead":
            return np.arange(m)
        if strategy == "random":
            return np.sort(rng.choice(n, m, replace=False))
        scores = rouge1_against_rest(sentences)
        return np.sort(np.argsort(-scores, kind="stable")[:m])

    def build(self, items: list[str | None], rng: np.random.Generator) -> Instances:
        sequences, splits = [], []
        for chunk in sentence_chunks(documents_of(items, self.tokenizer), self.source_budget):
            chosen = set(self.select(chunk, rng).tolist())
            source = [np.array([self.mask_id]) if k in chosen else s for k, s in enumerate(chunk)]
            framed = self.frame_source(np.concatenate(source))
            target = np.concatenate([chunk[k] for k in sorted(chosen)])
            sequences.append(np.concatenate([framed, target]))
            splits.append(len(framed))
        return Instances.from_sequences(sequences, split=splits)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S]; decoder_tokens/decoder_padding_mask/labels.lm [B,T]."""
        return self.collate_split(instances)


def rouge1(candidate: np.ndarray, reference: np.ndarray) -> float:
    """ROUGE-1 F1 of two token sequences (unigram counts clipped to the reference's)."""
    if len(candidate) == 0 or len(reference) == 0:
        return 0.0
    tokens, counts = np.unique(np.concatenate([candidate, reference]), return_inverse=True)
    cand = np.bincount(counts[:len(candidate)], minlength=len(tokens))
    ref = np.bincount(counts[len(candidate):], minlength=len(tokens))
    overlap = int(np.minimum(cand, ref).sum())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(candidate), overlap / len(reference)
    return 2 * precision * recall / (precision + recall)


def rouge1_against_rest(sentences: list[np.ndarray]) -> np.ndarray:
    """[n] ROUGE-1 F1 of every sentence against the other sentences joined, all at once."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    _, local = np.unique(np.concatenate(sentences), return_inverse=True)
    owner = np.repeat(np.arange(len(sentences)), lengths)
    counts = np.zeros((len(sentences), int(local.max()) + 1), dtype=np.int64)
    np.add.at(counts, (owner, local), 1)
    rest = counts.sum(axis=0)[None, :] - counts
    overlap = np.minimum(counts, rest).sum(axis=1)
    rest_lengths = lengths.sum() - lengths
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = overlap / lengths
        recall = overlap / rest_lengths
        f1 = 2 * precision * recall / (precision + recall)
    return np.where(overlap > 0, f1, 0.0)
