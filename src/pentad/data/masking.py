"""Dynamic masked-language-model masking over a whole batch at once (numpy, no Python loops).

BERT recipe (Devlin et al. 2019, section 3.1): a budget of ``max(1, round(mask_prob * n))`` of
each sequence's n maskable tokens is selected; a selected token becomes ``[MASK]`` with
probability 0.8, a random non-special token with 0.1, and stays unchanged with 0.1. The label is
the original token at selected positions and IGNORE_INDEX elsewhere. Masking happens at collate
time with the caller's generator, so every epoch sees new masks (RoBERTa's dynamic masking) and a
given (seed, batch) always gets the same ones.

Whole-word masking selects words instead of tokens: a word is a maximal run of maskable tokens
whose first token is a word start (``tokenizer.word_starts``) and whose other tokens are
continuations (WordPiece ``##`` pieces). Words are taken in random order until their tokens
reach the budget. Every token of a chosen word is then masked with the 80/10/10 rule.

Two options extend this (both collate-time, so a dataset stays valid when they change):

* **Span masking** (SpanBERT, Joshi et al. 2020): contiguous spans whose lengths follow a
  geometric distribution (``span_geo_prob`` 0.2) clipped at ``span_max_length`` (10), counted in
  words with whole-word masking and in tokens otherwise, are masked until the budget is reached;
  the 80/10/10 choice is made once per span. Spans never cross a special token.
* **A word segmenter** for whole-word masking (``word_segmenter``): ``none`` uses the tokenizer's
  own word boundaries (WordPiece ``##`` pieces, SentencePiece ``▁``, byte-level ``Ġ``), which
  make every CJK character a word; ``whitespace`` and ``jieba`` rebuild each sequence's text
  from its tokens and cut it into words with ``str.split``-style whitespace runs or with jieba
  (Chinese words; an optional dependency), as TencentPretrain's whole-word masking does.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from pentad.config.base import StrictModel
from pentad.errors import UserError

SPECIAL_ID_NAMES = ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id", "bos_id", "eos_id")

WordSegmenterName = Literal["none", "whitespace", "jieba"]

# Config keys of the masking options that only affect collate (see Objective.collate_options).
MASKING_COLLATE_OPTIONS = frozenset({"mask_prob", "whole_word_masking", "span_masking", "span_geo_prob",
                                     "span_max_length", "word_segmenter"})


class MaskingOptions(StrictModel):
    """Span masking and word segmentation, mixed into the configs of masking objectives (next to
    ``mask_prob`` and ``whole_word_masking`` from ``MaskingObjectiveConfig``)."""

    span_masking: bool = Field(
        False, description="Mask contiguous spans (SpanBERT) with geometric lengths instead of "
                           "independent tokens or words.")
    span_geo_prob: float = Field(0.2, gt=0.0, le=1.0,
                                 description="p of the geometric span-length distribution.")
    span_max_length: int = Field(10, ge=1, description="Longest span (in words with whole-word "
                                                       "masking, else in tokens).")
    word_segmenter: WordSegmenterName = Field(
        "none", description="Words for whole-word masking: 'none' (the tokenizer's own word "
                            "pieces), 'whitespace', or 'jieba' (Chinese; pip install jieba).")

    @model_validator(mode="after")
    def _segmenter_needs_whole_words(self) -> MaskingOptions:
        if self.word_segmenter != "none" and not getattr(self, "whole_word_masking", False):
            raise ValueError(f"word_segmenter '{self.word_segmenter}' decides the words of whole-word "
                             f"masking, which is off: set whole_word_masking: true as well, or "
                             f"word_segmenter: none")
        return self


def describe_tokenizer(tokenizer: Any) -> str:
    """Where a tokenizer comes from (e.g. ``vocab /path/vocab.txt``), for error messages."""
    config = getattr(tokenizer, "config", None)
    if callable(config):
        config = config()
    if hasattr(config, "model_dump"):
        config = config.model_dump()
    if isinstance(config, dict):
        files = [f"{key} {config[key]}" for key in ("vocab", "merges", "model") if config.get(key)]
        if files:
            return f"{config.get('type', 'tokenizer')} tokenizer ({', '.join(files)})"
    return repr(tokenizer)


def special_id_table(tokenizer: Any) -> np.ndarray:
    """[V] bool: True for the tokenizer's special ids (padding, unknown, CLS, SEP, MASK, BOS, EOS)."""
    table = np.zeros(int(tokenizer.vocab_size), dtype=bool)
    for name in SPECIAL_ID_NAMES:
        value = getattr(tokenizer, name, None)
        if value is not None:
            table[int(value)] = True
    extra = getattr(tokenizer, "special_ids", None)
    if extra is not None:
        ids = extra() if callable(extra) else extra
        table[np.asarray(list(ids), dtype=np.int64)] = True
    return table


class Masker:
    """Selects and replaces tokens for MLM; ``masker(ids, valid, rng) -> (inputs, labels)``.

    The tokenizer's tables (special ids, replacement candidates, word starts) are computed once
    here, so masking a batch is a handful of array operations.
    """

    def __init__(self, tokenizer: Any, mask_prob: float = 0.15, whole_word_masking: bool = False, *,
                 span_masking: bool = False, span_geo_prob: float = 0.2, span_max_length: int = 10,
                 word_segmenter: WordSegmenterName = "none"):
        if tokenizer.mask_id is None:
            raise UserError(
                f"masked language modelling needs a [MASK] token, but the {describe_tokenizer(tokenizer)} "
                f"has none: add a '[MASK]' entry to the vocabulary file, or choose an objective "
                f"without masking (e.g. lm).")
        self.mask_prob = float(mask_prob)
        self.mask_id = int(tokenizer.mask_id)
        self.is_special = special_id_table(tokenizer)
        self.replacements = np.flatnonzero(~self.is_special)
        if self.replacements.size == 0:
            raise UserError(f"the {describe_tokenizer(tokenizer)} has only special tokens; "
                            f"masking needs ordinary tokens to draw random replacements from.")
        # Word starts depend on the neighbouring token (e.g. after a SentencePiece control token),
        # so they are computed on each batch by the tokenizer's vectorised tables.
        self.word_starts = tokenizer.word_starts if whole_word_masking else None
        self.text_words = (TextWordStarts(tokenizer, word_segmenter)
                           if whole_word_masking and word_segmenter != "none" else None)
        self.span_masking = bool(span_masking)
        self.span_geo_prob = float(span_geo_prob)
        self.span_max_length = int(span_max_length)

    @classmethod
    def from_config(cls, tokenizer: Any, cfg: Any) -> Masker:
        """The masker a masking objective's config describes (``mask_prob``,
        ``whole_word_masking`` and, when present, the :class:`MaskingOptions` fields)."""
        return cls(tokenizer, cfg.mask_prob, cfg.whole_word_masking,
                   span_masking=getattr(cfg, "span_masking", False),
                   span_geo_prob=getattr(cfg, "span_geo_prob", 0.2),
                   span_max_length=getattr(cfg, "span_max_length", 10),
                   word_segmenter=getattr(cfg, "word_segmenter", "none"))

    def candidates(self, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """[B,S] bool: real (not padding) and not special tokens."""
        return valid & ~self.is_special[ids]

    def __call__(self, ids: np.ndarray, valid: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Mask a batch.

        Args:
            ids: [B,S] int64 token ids (padding included).
            valid: [B,S] bool, True at real tokens.
            rng: the generator that decides everything; same generator state, same masks.

        Returns:
            inputs [B,S] int64 (ids with the selected tokens replaced) and labels [B,S] int64
            (original id at selected positions, IGNORE_INDEX elsewhere).
        """
        candidates = self.candidates(ids, valid)
        starts = None
        if self.word_starts is not None:
            starts = np.asarray(self.word_starts(ids), dtype=bool)
            if self.text_words is not None:
                starts = self.text_words(ids, candidates, starts)
        if self.span_masking:
            selected, spans = select_spans(candidates, starts, self.mask_prob, self.span_geo_prob,
                                           self.span_max_length, rng)
            return self.replace(ids, selected, rng, groups=spans)
        if starts is None:
            selected = select_tokens(candidates, self.mask_prob, rng)
        else:
            selected = select_words(candidates, starts, self.mask_prob, rng)
        return self.replace(ids, selected, rng)

    def replace(self, ids: np.ndarray, selected: np.ndarray, rng: np.random.Generator,
                groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Apply 80% [MASK] / 10% random / 10% unchanged to the ``selected`` positions [B,S].

        With ``groups`` ([B,S] int64 span ids, -1 outside spans) the choice is made once per
        span, as SpanBERT does; random replacements are still drawn per token.
        """
        if groups is None:
            draw = rng.random(ids.shape)
        else:
            per_group = rng.random(max(int(groups.max()) + 1, 1))
            draw = np.where(groups >= 0, per_group[np.maximum(groups, 0)], 1.0)
        to_mask = selected & (draw < 0.8)
        to_random = selected & (draw >= 0.8) & (draw < 0.9)
        inputs = ids.copy()
        inputs[to_mask] = self.mask_id
        picks = rng.integers(0, self.replacements.size, size=int(to_random.sum()))
        inputs[to_random] = self.replacements[picks]
        # Imported here: this module is imported by preprocess workers, which must not pay for
        # torch (see pentad.data.objectives.base).
        from pentad.components.base import IGNORE_INDEX

        labels = np.where(selected, ids, IGNORE_INDEX).astype(np.int64)
        return inputs, labels


# ---- words from a text segmenter ----------------------------------------------------------

_WHITESPACE_WORDS = re.compile(r"\s+|\S+")
# Marks that subword vocabularies use for a preceding space (SentencePiece, byte-level BPE).
_SPACE_MARKS = str.maketrans({"\u2581": " ", "\u0120": " ", "\u010a": "\n", "\u0109": "\t"})


def is_cjk(char: str) -> bool:
    """Whether ``char`` is a CJK ideograph (the characters Chinese word segmentation joins)."""
    code = ord(char)
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF
            or 0x20000 <= code <= 0x2FA1F)


class TextWordStarts:
    """Word starts from a word segmenter run over the text rebuilt from a batch's tokens.

    ``text_words(ids, candidates, token_starts) -> starts [B,S] bool``. Each run of maskable
    tokens (runs are cut at special tokens and padding) is turned back into text: a token's
    surface is its vocabulary string without WordPiece's ``##`` and with SentencePiece/byte-level
    space marks as spaces; a space goes before every token that starts a word for the tokenizer,
    except (for ``jieba``) between two CJK characters, which the segmenter must see joined.
    A token then starts a word when the tokenizer says it may and the segmenter puts a word
    boundary at its first character. This is what TencentPretrain's whole-word masking does
    (join the tokens, segment with jieba), without changing the token sequence.
    """

    def __init__(self, tokenizer: Any, segmenter: WordSegmenterName):
        if segmenter == "jieba":
            import importlib.util

            if importlib.util.find_spec("jieba") is None:
                raise UserError("word_segmenter 'jieba' needs the jieba package, which is not "
                                "installed: `pip install jieba`, or choose word_segmenter "
                                "'whitespace' or 'none'.")
        self.segmenter = segmenter
        self.tokenizer = tokenizer
        self.glue_cjk = segmenter == "jieba"
        self._surfaces: list[str] | None = None
        self._jieba: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The jieba dictionary (tens of MB) is rebuilt on first use in each DataLoader worker.
        state = dict(self.__dict__)
        state["_jieba"] = None
        return state

    def surfaces(self) -> list[str]:
        """The text of every vocabulary id (built once, on first use)."""
        if self._surfaces is None:
            table = []
            for i in range(int(self.tokenizer.vocab_size)):
                try:
                    token = self.tokenizer.id_to_token(i)
                except IndexError:
                    token = "\ufffd"
                if token.startswith("##") and len(token) > 2:
                    token = token[2:]
                table.append(token.translate(_SPACE_MARKS) or "\ufffd")
            self._surfaces = table
        return self._surfaces

    def segment(self, text: str) -> list[str]:
        """Words and whitespace runs of ``text``, in order (their concatenation is ``text``)."""
        if self.segmenter == "whitespace":
            return _WHITESPACE_WORDS.findall(text)
        if self._jieba is None:
            import logging

            import jieba

            jieba.setLogLevel(logging.WARNING)  # no "Building prefix dict" banner per worker
            self._jieba = jieba.Tokenizer()
        return self._jieba.lcut(text)

    def __call__(self, ids: np.ndarray, candidates: np.ndarray, token_starts: np.ndarray) -> np.ndarray:
        surfaces = self.surfaces()
        starts = token_starts.copy()
        for b in range(ids.shape[0]):
            positions = np.flatnonzero(candidates[b])
            if positions.size == 0:
                continue
            # Runs of consecutive candidates: a special token or padding separates them.
            breaks = np.flatnonzero(np.diff(positions) != 1) + 1
            for run in np.split(positions, breaks):
                self._mark_run(ids[b], run.tolist(), token_starts[b], starts[b], surfaces)
        return starts

    def _mark_run(self, row: np.ndarray, run: list[int], token_starts: np.ndarray, out: np.ndarray,
                  surfaces: list[str]) -> None:
        parts: list[str] = []
        offsets: list[int] = []
        size = 0
        previous = ""
        for k, position in enumerate(run):
            surface = surfaces[int(row[position])]
            space = (k > 0 and bool(token_starts[position]) and not surface[0].isspace()
                     and not (self.glue_cjk and is_cjk(previous) and is_cjk(surface[0])))
            lead = len(surface) - len(surface.lstrip())
            if lead == len(surface):
                lead = 0  # a token that is only a space mark starts where it stands
            offsets.append(size + int(space) + lead)
            parts.append(" " + surface if space else surface)
            size += len(parts[-1])
            previous = surface[-1]
        boundaries = set()
        at = 0
        for word in self.segment("".join(parts)):
            stripped = word.lstrip()
            if stripped:
                boundaries.add(at + len(word) - len(stripped))
            at += len(word)
        for position, offset in zip(run, offsets):
            out[position] = bool(token_starts[position]) and offset in boundaries


def _budget(counts: np.ndarray, mask_prob: float) -> np.ndarray:
    """Tokens to select per row: max(1, round(mask_prob * count)), 0 for rows with no candidate."""
    budget = np.maximum(1, np.rint(mask_prob * counts)).astype(np.int64)
    return np.where(counts > 0, budget, 0)


def select_tokens(candidates: np.ndarray, mask_prob: float, rng: np.random.Generator) -> np.ndarray:
    """[B,S] bool: exactly the budget of each row, chosen uniformly among its candidates."""
    batch, length = candidates.shape
    budget = _budget(candidates.sum(axis=1), mask_prob)
    # Random keys, with non-candidates sorted last; a position is selected when its rank within
    # the row is below the row's budget.
    keys = rng.random((batch, length))
    keys[~candidates] = 2.0
    order = np.argsort(keys, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(length), (batch, length)), axis=1)
    return ranks < budget[:, None]


def select_words(candidates: np.ndarray, word_start: np.ndarray, mask_prob: float,
                 rng: np.random.Generator) -> np.ndarray:
    """[B,S] bool: whole words chosen in random order until they cover about the token budget.

    Args:
        candidates: [B,S] bool maskable positions.
        word_start: [B,S] bool, True where a token starts a word.
    """
    batch, length = candidates.shape
    budget = _budget(candidates.sum(axis=1), mask_prob)
    previous = np.zeros_like(candidates)
    previous[:, 1:] = candidates[:, :-1]
    # A word starts at a word-start token or after a non-candidate (a special token or a row
    # start): continuation pieces never join a word across [CLS]/[SEP].
    starts = candidates & (word_start | ~previous)
    flat_cand = candidates.ravel()
    unit_of = np.cumsum(starts.ravel()) - 1  # word index of each position (valid at candidates)
    num_units = int(starts.sum())
    if num_units == 0:
        return np.zeros_like(candidates)
    unit_row = np.nonzero(starts)[0]
    unit_len = np.bincount(unit_of[flat_cand], minlength=num_units)
    # Shuffle the words within each row, then take words while the tokens taken before them
    # plus half the word stay under the budget (rounding to the nearest word boundary).
    order = np.lexsort((rng.random(num_units), unit_row))
    sorted_len = unit_len[order]
    sorted_row = unit_row[order]
    cumulative = np.cumsum(sorted_len)
    row_first = np.ones(num_units, dtype=bool)
    row_first[1:] = sorted_row[1:] != sorted_row[:-1]
    row_base = np.maximum.accumulate(np.where(row_first, cumulative - sorted_len, 0))
    taken_before = cumulative - sorted_len - row_base
    take = (taken_before + sorted_len / 2 < budget[sorted_row]) | row_first  # >= 1 word per row
    chosen = np.empty(num_units, dtype=bool)
    chosen[order] = take
    selected = np.zeros(batch * length, dtype=bool)
    selected[flat_cand] = chosen[unit_of[flat_cand]]
    return selected.reshape(batch, length)


def select_spans(candidates: np.ndarray, word_start: np.ndarray | None, mask_prob: float,
                 geo_prob: float, max_length: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Spans of consecutive units (SpanBERT), until each row's budget is covered.

    A unit is a token, or a whole word when ``word_start`` is given. Span lengths (in units) are
    ``min(Geometric(geo_prob), max_length)``; a span starts at a uniformly drawn unit and stops
    at the end of its run of candidates (it never crosses a special token) or where an earlier
    span begins (so spans are contiguous and distinct). Units are added
    while the tokens taken plus half the unit stay under the budget, so the budget is met
    exactly for tokens and to the nearest word boundary for words.

    Returns:
        selected [B,S] bool and span ids [B,S] int64 (unique across the batch, -1 elsewhere).
    """
    batch, length = candidates.shape
    budget = _budget(candidates.sum(axis=1), mask_prob)
    previous = np.zeros_like(candidates)
    previous[:, 1:] = candidates[:, :-1]
    starts = candidates if word_start is None else candidates & (word_start | ~previous)
    following = np.zeros_like(candidates)
    following[:, :-1] = candidates[:, 1:]
    run_last = candidates & ~following  # the last candidate of each run
    # Overlapping draws add nothing, so draw generously; leftover draws are simply unused.
    tries = 4 * int(budget.max(initial=0)) + 16
    lengths = np.minimum(rng.geometric(geo_prob, size=(batch, tries)), max_length)
    anchors = rng.random((batch, tries))
    selected = np.zeros_like(candidates)
    spans = np.full(candidates.shape, -1, dtype=np.int64)
    next_span = 0
    for b in range(batch):
        if budget[b] == 0:
            continue
        unit_pos = np.flatnonzero(starts[b])
        ends = np.flatnonzero(run_last[b])
        run_of_unit = np.searchsorted(ends, unit_pos)  # the run each unit lies in
        unit_end = ends[run_of_unit] + 1
        unit_end[:-1] = np.minimum(unit_end[:-1], unit_pos[1:])
        unit_len = (unit_end - unit_pos).tolist()
        # One past the last unit of each unit's run: a span stops there.
        run_stop = np.searchsorted(run_of_unit, run_of_unit, side="right").tolist()
        count = len(unit_len)
        span_of = [-1] * count
        taken = 0
        for t in range(tries):
            if taken >= budget[b]:
                break
            first = min(int(anchors[b, t] * count), count - 1)
            for k in range(first, min(first + int(lengths[b, t]), run_stop[first])):
                # A span ends where an earlier one begins, so every span stays contiguous.
                if span_of[k] >= 0 or (taken + unit_len[k] / 2 >= budget[b] and taken > 0):
                    break
                span_of[k] = next_span
                taken += unit_len[k]
            next_span += 1
        if taken < budget[b]:
            # Draws ran out on a crowded row: finish with single units, in random order.
            for k in rng.permutation(count).tolist():
                if taken >= budget[b]:
                    break
                if span_of[k] < 0 and (taken + unit_len[k] / 2 < budget[b] or taken == 0):
                    span_of[k] = next_span
                    taken += unit_len[k]
                    next_span += 1
        unit_of = np.cumsum(starts[b]) - 1  # unit index of each position (valid at candidates)
        chosen = np.asarray(span_of, dtype=np.int64)[np.maximum(unit_of, 0)]
        row = candidates[b] & (chosen >= 0)
        selected[b] = row
        spans[b] = np.where(row, chosen, -1)
    return selected, spans
