"""Span masking and whole-word masking with a word segmenter (whitespace, jieba)."""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest
from pydantic import ValidationError

from pentad.components.base import IGNORE_INDEX
from pentad.data.masking import Masker, select_spans
from pentad.data.objectives import AlbertObjective, BertObjective, ClsMlmObjective, MlmObjective
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError

HAS_JIEBA = importlib.util.find_spec("jieba") is not None


@pytest.fixture(scope="module")
def tok(shared_data):
    return load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")})


def encode_rows(tok, texts):
    """[CLS] text [SEP] rows, right-padded: ids [B,S] and valid [B,S]."""
    seqs = [[tok.cls_id, *tok.encode(t), tok.sep_id] for t in texts]
    width = max(map(len, seqs))
    ids = np.full((len(seqs), width), tok.pad_id, dtype=np.int64)
    valid = np.zeros_like(ids, dtype=bool)
    for b, seq in enumerate(seqs):
        ids[b, :len(seq)], valid[b, :len(seq)] = seq, True
    return ids, valid


@pytest.fixture(scope="module")
def corpus_rows(tok, shared_data):
    with open(shared_data / "corpora/CLUECorpusSmall_sampled.txt", encoding="utf-8") as f:
        texts = [next(f)[:300] for _ in range(64)]
    return encode_rows(tok, texts)


def test_token_spans_meet_the_budget_and_stay_inside_runs():
    rng = np.random.default_rng(0)
    candidates = rng.random((256, 120)) < 0.97  # scattered non-candidates cut the runs
    candidates[:, 0] = candidates[:, -1] = False
    selected, spans = select_spans(candidates, None, 0.15, 0.2, 10, rng)
    counts = candidates.sum(1)
    assert selected.sum(1).tolist() == np.maximum(1, np.rint(0.15 * counts)).astype(int).tolist()
    assert not (selected & ~candidates).any()
    assert ((spans >= 0) == selected).all()
    for b in range(len(spans)):
        for span in np.unique(spans[b][spans[b] >= 0]):
            where = np.flatnonzero(spans[b] == span)
            assert (np.diff(where) == 1).all()  # a span is contiguous ...
            assert candidates[b, where[0]:where[-1] + 1].all()  # ... and never crosses a non-candidate
    lengths = np.bincount(spans[spans >= 0])
    lengths = lengths[lengths > 0]
    assert lengths.max() <= 10
    # Geometric(0.2) clipped at 10 has mean ~3.8 (SpanBERT); budgets and runs cut some spans short.
    assert 2.5 < lengths.mean() < 4.5


def test_word_spans_keep_words_whole():
    rng = np.random.default_rng(1)
    candidates = np.ones((128, 80), dtype=bool)
    candidates[:, 0] = candidates[:, -1] = False
    word_start = rng.random((128, 80)) < 0.5
    selected, _ = select_spans(candidates, word_start, 0.15, 0.2, 10, rng)
    word = np.cumsum(word_start | ~np.roll(candidates, 1, axis=1), axis=1)
    for b in range(len(selected)):
        for w in np.unique(word[b][selected[b]]):
            assert selected[b][(word[b] == w) & candidates[b]].all()
    assert abs(selected.sum() / candidates.sum() - 0.15) < 0.03


def test_span_masking_decides_80_10_10_per_span(tok, corpus_rows):
    ids, valid = corpus_rows
    masker = Masker(tok, 0.15, span_masking=True)
    rng = np.random.default_rng(5)
    selected, spans = select_spans(masker.candidates(ids, valid), None, 0.15, 0.2, 10, rng)
    inputs, labels = masker.replace(ids, selected, rng, groups=spans)
    assert ((labels != IGNORE_INDEX) == selected).all()
    masked = inputs == tok.mask_id
    for span in np.unique(spans[spans >= 0]):
        where = spans == span
        assert masked[where].all() or not masked[where].any()
    share = np.mean([masked[spans == s].all() for s in np.unique(spans[spans >= 0])])
    assert 0.7 < share < 0.9
    # Through __call__ (what the objectives use), same rate, never special tokens.
    inputs, labels = masker(ids, valid, np.random.default_rng(2))
    chosen = labels != IGNORE_INDEX
    assert not (chosen & ~masker.candidates(ids, valid)).any()
    assert abs(chosen.sum() / masker.candidates(ids, valid).sum() - 0.15) < 0.01


def test_whitespace_segmenter_keeps_the_tokenizers_words(tok):
    ids, valid = encode_rows(tok, ["hello unbelievable world，中国", "数学 exam"])
    masker = Masker(tok, 0.15, whole_word_masking=True, word_segmenter="whitespace")
    cand = masker.candidates(ids, valid)
    starts = tok.word_starts(ids)
    # WordPiece keeps no spaces, so whitespace words are the tokenizer's own ("un ##bel ##ie ...").
    assert (masker.text_words(ids, cand, starts)[cand] == starts[cand]).all()


@pytest.mark.skipif(not HAS_JIEBA, reason="jieba is not installed")
def test_jieba_segmenter_masks_chinese_words_whole(tok):
    text = "我爱北京天安门，中国人民万岁，unbelievable"
    ids, valid = encode_rows(tok, [text] * 64)
    masker = Masker(tok, 0.3, whole_word_masking=True, word_segmenter="jieba")
    starts = masker.text_words(ids, masker.candidates(ids, valid), tok.word_starts(ids))
    tokens = [tok.id_to_token(i) for i in ids[0][valid[0]]]
    words, current = [], ""
    for token, start in zip(tokens[1:-1], starts[0][valid[0]][1:-1]):
        if start and current:
            words.append(current)
            current = ""
        current += token.removeprefix("##")
    words.append(current)
    assert {"北京", "天安门", "中国", "人民", "万岁", "unbelievable"} <= set(words)
    _, labels = masker(ids, valid, np.random.default_rng(0))
    tiananmen = [k for k, t in enumerate(tokens) if t in "天安门"][:3]
    chosen = labels[:, tiananmen] != IGNORE_INDEX
    assert (chosen.all(1) | ~chosen.any(1)).all() and chosen.any()  # all three or none
    assert isinstance(pickle.loads(pickle.dumps(masker)), Masker)  # DataLoader workers


def test_jieba_missing_is_a_user_error(tok, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jieba" else real(name, *a))
    with pytest.raises(UserError, match="pip install jieba"):
        MlmObjective(MlmObjective.Config(whole_word_masking=True, word_segmenter="jieba"), tok)


def test_masking_options_on_every_masking_objective(tok):
    for cls in (BertObjective, MlmObjective, AlbertObjective, ClsMlmObjective):
        plain, spans = cls.Config(), cls.Config(span_masking=True, span_max_length=5,
                                                whole_word_masking=True, word_segmenter="whitespace")
        a, b = cls(plain, tok), cls(spans, tok)
        assert b.masker.span_masking and b.masker.span_max_length == 5
        # Collate-only options: a dataset preprocessed with one setting serves the other.
        assert a.instance_options() == b.instance_options()
        with pytest.raises(ValidationError, match="whole_word_masking"):
            cls.Config(word_segmenter="whitespace")
