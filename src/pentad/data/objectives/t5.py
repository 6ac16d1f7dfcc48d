"""T5 span corruption (Raffel et al. 2020, section 3.1.4), applied at collate time.

Stored instances are plain text pieces: each document (one per line) is cut into pieces of
``seq_length - 2`` tokens (one less without a BOS), or with ``pack`` the documents, each followed
by the EOS, are concatenated and cut into windows of that size across document boundaries.

At collate time each piece of n tokens is corrupted afresh (so every epoch sees new noise):
``round(n * noise_density)`` tokens (at least 1, at most n - 1) are split into
``round(noise / mean_span_length)`` spans of random lengths, interleaved with as many
non-noise runs (the sequence starts with a non-noise run, as in T5). In the source each span
becomes one sentinel ``<extra_id_k>`` (k = 0, 1, ... in order); the target is every sentinel
followed by its span, then the EOS. Source + target therefore give back the original text:
replacing each sentinel of the source by the tokens after it in the target.

Sentinels are looked up by name (``sentinel_format``) in the vocabulary, so any vocabulary that
has them works, e.g. TencentPretrain's ``google_zh_with_sentinel_vocab.txt`` (``<extra_id_0>`` ..
``<extra_id_99>`` after the BERT vocabulary) or a T5 SentencePiece model. The number of spans per
sequence is capped by the number of sentinels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from pentad.data.masking import describe_tokenizer
from pentad.data.objectives.mt import Seq2SeqObjective, Seq2SeqObjectiveConfig, seq2seq_batch
from pentad.data.shards import Instances, concat_ranges
from pentad.errors import UserError
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

# Sentinels are looked up as k = 0, 1, ... until the first missing one; no vocabulary has more.
MAX_SENTINELS = 10_000


class T5ObjectiveConfig(Seq2SeqObjectiveConfig):
    type: Literal["t5"] = "t5"
    noise_density: float = Field(0.15, gt=0.0, lt=1.0, description="Fraction of tokens corrupted.")
    mean_span_length: float = Field(3.0, ge=1.0, description="Mean length of a corrupted span.")
    pack: bool = Field(False, description="Pack documents into full windows across document "
                                          "boundaries (each document followed by the EOS).")
    sentinel_format: str = Field("<extra_id_{k}>", description="Name of sentinel k in the vocabulary.")

    @field_validator("sentinel_format")
    @classmethod
    def _has_k(cls, value: str) -> str:
        if "{k}" not in value:
            raise ValueError(f"sentinel_format must contain '{{k}}' (the sentinel number); "
                             f"got {value!r}")
        return value


@OBJECTIVES.register("t5")
class T5Objective(Seq2SeqObjective):
    """Documents -> span-corrupted source and sentinel-delimited target."""

    Config = T5ObjectiveConfig
    corpus_format: ClassVar[str] = "one document per line (UTF-8 text)"
    collate_options: ClassVar[frozenset[str]] = frozenset({"decoder_start", "noise_density",
                                                           "mean_span_length", "sentinel_format"})

    def __init__(self, cfg: T5ObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: T5ObjectiveConfig = cfg
        self.sentinel_ids = find_sentinels(tokenizer, cfg.sentinel_format)
        if self.source_budget < 1:
            raise UserError(f"objective 't5': seq_length {self.seq_length} leaves no room for text "
                            f"besides the framing tokens.")

    @property
    def packs(self) -> bool:
        return self.cfg.pack

    @property
    def window(self) -> tuple[int, int]:
        return self.source_budget, self.source_budget

    def build(self, items: list[str], rng: np.random.Generator) -> Instances | np.ndarray:
        documents = [np.asarray(ids, dtype=np.int64) for ids in self.tokenizer.encode_batch(items)
                     if len(ids)]
        if self.cfg.pack:
            parts = [np.append(d, self.eos_id) for d in documents]
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return text_pieces(documents, self.source_budget)

    def corrupt(self, text: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) of one text piece: the source unframed, the target ending with EOS."""
        noise = noise_mask(len(text), self.cfg.noise_density, self.cfg.mean_span_length,
                           len(self.sentinel_ids), rng)
        previous = np.concatenate([[False], noise[:-1]])
        span_start = noise & ~previous
        span_index = np.cumsum(span_start) - 1
        sentinels = np.asarray(self.sentinel_ids, dtype=np.int64)
        source = np.where(span_start, sentinels[np.maximum(span_index, 0)], text)[~noise | span_start]
        # Target: each noise token shifted right by the sentinels of its own and earlier spans.
        noise_positions = np.flatnonzero(noise)
        num_spans = int(span_start.sum())
        target = np.empty(len(noise_positions) + num_spans + 1, dtype=np.int64)
        slots = np.arange(len(noise_positions)) + span_index[noise_positions] + 1
        target[slots] = text[noise_positions]
        first_of_span = np.flatnonzero(span_start[noise_positions])  # rank of each span's first token
        target[first_of_span + np.arange(num_spans)] = sentinels[:num_spans]
        target[-1] = self.target_eos_id
        return source, target

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S] (corrupted, framed); decoder_tokens/decoder_padding_mask/
        labels.lm [B,T] (sentinels and spans, then EOS)."""
        offsets = instances.offsets
        sources, targets = [], []
        for i in range(len(instances)):
            source, target = self.corrupt(instances.tokens[offsets[i]:offsets[i + 1]], rng)
            sources.append(self.frame_source(source))
            targets.append(target)
        source_ids, source_valid = Instances.from_sequences(sources).padded(self.pad_id)
        return seq2seq_batch(source_ids, source_valid, Instances.from_sequences(targets),
                             self.decoder_start_id, self.target_pad_id)


def find_sentinels(tokenizer: Any, sentinel_format: str) -> list[int]:
    """Ids of sentinels 0, 1, ... (up to the first one missing); UserError when there is none."""
    ids = []
    for k in range(MAX_SENTINELS):
        index = tokenizer.token_to_id(sentinel_format.replace("{k}", str(k)))
        if index is None:
            break
        ids.append(int(index))
    if not ids:
        example = sentinel_format.replace("{k}", "0")
        raise UserError(
            f"objective 't5' needs sentinel tokens {example}, {sentinel_format.replace('{k}', '1')}, "
            f"... in the vocabulary, but the {describe_tokenizer(tokenizer)} has no {example!r}; "
            f"use a vocabulary with sentinels (e.g. TencentPretrain's "
            f"google_zh_with_sentinel_vocab.txt) or set objective.sentinel_format to the names "
            f"your vocabulary uses.")
    return ids


def text_pieces(documents: list[np.ndarray], size: int) -> Instances:
    """Every document cut into consecutive pieces of at most ``size`` tokens (no special tokens)."""
    if not documents:
        return Instances.from_sequences([])
    text = np.concatenate(documents)
    doc_lengths = np.array([len(d) for d in documents], dtype=np.int64)
    doc_starts = np.cumsum(doc_lengths) - doc_lengths
    pieces_per_doc = -(-doc_lengths // size)
    piece_doc = np.repeat(np.arange(len(documents)), pieces_per_doc)
    piece_rank = np.arange(len(piece_doc)) - np.repeat(np.cumsum(pieces_per_doc) - pieces_per_doc,
                                                        pieces_per_doc)
    piece_start = doc_starts[piece_doc] + piece_rank * size
    piece_len = np.minimum(size, doc_lengths[piece_doc] - piece_rank * size)
    return Instances(text[concat_ranges(piece_start, piece_len)], piece_len)


def random_segmentation(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """``parts`` positive integers summing to ``total``, uniformly over such compositions."""
    cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False) + 1) if parts > 1 else []
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)


def noise_mask(length: int, density: float, mean_span: float, max_spans: int,
               rng: np.random.Generator) -> np.ndarray:
    """[length] bool: T5's noise positions, alternating non-noise and noise runs.

    A single token is all noise (there is nothing else to keep).
    """
    if length < 2:
        return np.ones(length, dtype=bool)
    num_noise = min(max(int(round(length * density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_span)), 1)
    num_spans = min(num_spans, num_noise, length - num_noise, max_spans)
    noise_lengths = random_segmentation(num_noise, num_spans, rng)
    keep_lengths = random_segmentation(length - num_noise, num_spans, rng)
    runs = np.stack([keep_lengths, noise_lengths], axis=1).ravel()
    return np.repeat(np.tile([False, True], num_spans), runs)
