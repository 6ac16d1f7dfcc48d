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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pentad.errors import UserError

SPECIAL_ID_NAMES = ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id", "bos_id", "eos_id")


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

    def __init__(self, tokenizer: Any, mask_prob: float = 0.15, whole_word_masking: bool = False):
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
        if self.word_starts is None:
            selected = select_tokens(candidates, self.mask_prob, rng)
        else:
            starts = np.asarray(self.word_starts(ids), dtype=bool)
            selected = select_words(candidates, starts, self.mask_prob, rng)
        return self.replace(ids, selected, rng)

    def replace(self, ids: np.ndarray, selected: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Apply 80% [MASK] / 10% random / 10% unchanged to the ``selected`` positions [B,S]."""
        draw = rng.random(ids.shape)
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
