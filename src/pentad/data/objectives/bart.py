"""BART denoising (Lewis et al. 2020): sentence permutation + text infilling; target = original.

Corpus: the ``bert`` document format (one sentence per line, a blank line between documents).
Each document's sentences are gathered, in order, into chunks of at most ``seq_length - 2``
tokens (a sentence longer than that is cut into pieces that count as sentences). A chunk is an
instance; with ``permute_sentences`` its sentences are shuffled once, at preprocessing (seeded),
and the instance stores the original text followed by the shuffled text (2n tokens).

Text infilling happens at collate time, so every epoch sees new noise: of the (shuffled) text's
n tokens, ``ceil(mask_prob * n)`` are covered by spans whose lengths are drawn from
Poisson(``poisson_lambda``); each span, including a span of length 0 (an insertion), becomes a
single ``[MASK]`` in the source. Spans are placed in distinct gaps between the kept tokens, so
two spans never touch. The source is ``[BOS] noised text [EOS]``, the target the original text
then EOS (see :mod:`pentad.data.objectives.mt` for the decoder-side fields). For BART's exact
convention set ``decoder_start: eos``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.objectives.mt import Seq2SeqObjective, Seq2SeqObjectiveConfig, seq2seq_batch
from pentad.data.shards import Instances, concat_ranges
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

DOCUMENT_FORMAT = ("one sentence per line, documents separated by a blank line (UTF-8 text)")


class BartObjectiveConfig(Seq2SeqObjectiveConfig):
    type: Literal["bart"] = "bart"
    mask_prob: float = Field(0.3, gt=0.0, lt=1.0, description="Fraction of tokens covered by "
                                                              "infilling spans (BART: 0.3).")
    poisson_lambda: float = Field(3.0, gt=0.0, description="Mean span length (Poisson).")
    permute_sentences: bool = Field(True, description="Shuffle the sentences of every instance.")


@OBJECTIVES.register("bart")
class BartObjective(Seq2SeqObjective):
    """Documents -> (permuted, infilled source; original target)."""

    Config = BartObjectiveConfig
    corpus_format: ClassVar[str] = DOCUMENT_FORMAT
    collate_options: ClassVar[frozenset[str]] = frozenset({"decoder_start", "mask_prob",
                                                           "poisson_lambda"})
    documents_end_at_blank_lines: ClassVar[bool] = True

    def __init__(self, cfg: BartObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: BartObjectiveConfig = cfg
        self.require_ids(**{"[MASK]": tokenizer.mask_id})
        self.mask_id = int(tokenizer.mask_id)
        if self.source_budget < 1:
            raise UserError(f"objective 'bart': seq_length {self.seq_length} leaves no room for "
                            f"text besides the framing tokens.")

    def parse_line(self, text: str, context: Any) -> str | None:
        """A sentence, or None for a blank line (end of document)."""
        return text if text.strip() else None

    def build(self, items: list[str | None], rng: np.random.Generator) -> Instances:
        """Chunks of sentences; stored as original text (+ the permuted text)."""
        sequences = []
        for chunk in sentence_chunks(documents_of(items, self.tokenizer), self.source_budget):
            original = np.concatenate(chunk)
            if self.cfg.permute_sentences:
                order = rng.permutation(len(chunk))
                original = np.concatenate([original] + [chunk[k] for k in order])
            sequences.append(original)
        return Instances.from_sequences(sequences)

    def texts(self, instances: Instances) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(original, permuted) texts of stored instances."""
        offsets = instances.offsets
        originals, permuted = [], []
        for i in range(len(instances)):
            stored = instances.tokens[offsets[i]:offsets[i + 1]]
            n = len(stored) // 2 if self.cfg.permute_sentences else len(stored)
            originals.append(stored[:n])
            permuted.append(stored[n:] if self.cfg.permute_sentences else stored)
        return originals, permuted

    def infill(self, text: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``text`` with Poisson-length spans each replaced by one ``[MASK]`` (see module doc)."""
        n = len(text)
        budget = int(np.ceil(self.cfg.mask_prob * n))
        lengths: list[int] = []
        total = 0
        while total < budget:
            for length in rng.poisson(self.cfg.poisson_lambda, size=max(4, budget // 2)).tolist():
                lengths.append(min(length, budget - total))
                total += lengths[-1]
                if total >= budget:
                    break
        spans = np.asarray(lengths, dtype=np.int64)
        kept = n - budget
        # A 0-length span adds a [MASK]; drop insertions beyond the budget so that the source
        # never grows past n tokens (only possible when a few tokens draw several zeros).
        excess = len(spans) - max(budget, 1)
        if excess > 0:
            spans = np.delete(spans, np.flatnonzero(spans == 0)[:excess])
        # Spans take distinct gaps among the kept + 1 (before, between and after kept tokens);
        # with more spans than gaps (mask_prob near 1) the last gap takes the remaining noise.
        if len(spans) > kept + 1:
            spans = np.append(spans[:kept], spans[kept:].sum())
        gaps = np.sort(rng.choice(kept + 1, size=len(spans), replace=False))
        starts = gaps + np.cumsum(spans) - spans  # where each span begins in ``text``
        noise = np.zeros(n, dtype=bool)
        noise[concat_ranges(starts, spans)] = True
        # np.insert puts a [MASK] before kept token ``gap`` (at the end for gap == kept).
        return np.insert(text[~noise], gaps, self.mask_id).astype(np.int64)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S] (noised, framed); decoder side [B,T] with the original text."""
        originals, permuted = self.texts(instances)
        sources = [self.frame_source(self.infill(text, rng)) for text in permuted]
        targets = [np.append(text, self.target_eos_id) for text in originals]
        source_ids, source_valid = Instances.from_sequences(sources).padded(self.pad_id)
        return seq2seq_batch(source_ids, source_valid, Instances.from_sequences(targets),
                             self.decoder_start_id, self.target_pad_id)


def documents_of(items: list[str | None], tokenizer: Any) -> list[list[np.ndarray]]:
    """Sentence lines (None = blank line) -> documents as lists of token arrays.

    Sentences that tokenize to nothing carry no text and are left out; so are empty documents.
    """
    encoded = iter(tokenizer.encode_batch([s for s in items if s is not None]))
    documents: list[list[np.ndarray]] = [[]]
    for item in items:
        if item is None:
            if documents[-1]:
                documents.append([])
            continue
        ids = next(encoded)
        if ids:
            documents[-1].append(np.asarray(ids, dtype=np.int64))
    if not documents[-1]:
        documents.pop()
    return documents


def sentence_chunks(documents: list[list[np.ndarray]], budget: int) -> list[list[np.ndarray]]:
    """Consecutive sentences of each document gathered into chunks of at most ``budget`` tokens.

    A chunk never spans two documents; a sentence longer than ``budget`` is cut into pieces of
    ``budget`` tokens that count as sentences.
    """
    chunks: list[list[np.ndarray]] = []
    for document in documents:
        current: list[np.ndarray] = []
        size = 0
        pieces = itertools.chain.from_iterable(
            [s[k:k + budget] for k in range(0, len(s), budget)] for s in document)
        for piece in pieces:
            if current and size + len(piece) > budget:
                chunks.append(current)
                current, size = [], 0
            current.append(piece)
            size += len(piece)
        if current:
            chunks.append(current)
    return chunks
