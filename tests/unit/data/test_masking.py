"""Dynamic MLM masking: rates, special tokens, whole words, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from pentad.components.base import IGNORE_INDEX
from pentad.data.masking import Masker, select_tokens
from pentad.data.objectives import BertObjective, MlmObjective
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = 150  # ids 5..154 are word starts "w<k>", ids 155..304 continuation pieces "##p<k>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    tokens = SPECIALS + [f"w{k}" for k in range(WORDS)] + [f"##p{k}" for k in range(WORDS)]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(path)})


def make_batch(rng, batch=1024, length=128, pieces=False):
    """[CLS] words [SEP] then padding; returns ids, valid and the word index of each position."""
    ids = np.zeros((batch, length), dtype=np.int64)
    word = np.full((batch, length), -1)
    lengths = rng.integers(3, length + 1, size=batch)
    lengths[:8] = [3, 3, 4, 5, 3, 4, 6, 7]  # rows with 1-5 maskable tokens
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n - 1] = 2, 3
        w = -1
        for j in range(1, n - 1):
            if not pieces or j == 1 or rng.random() < 0.5:
                ids[b, j] = 5 + rng.integers(0, WORDS)
                w += 1
            else:
                ids[b, j] = 5 + WORDS + rng.integers(0, WORDS)
            word[b, j] = w
    valid = np.arange(length)[None, :] < lengths[:, None]
    return ids, valid, word


def test_rates_and_special_tokens(tokenizer):
    rng = np.random.default_rng(0)
    ids, valid, _ = make_batch(rng)
    masker = Masker(tokenizer, 0.15)
    inputs, labels = masker(ids, valid, np.random.default_rng(1))
    selected = labels != IGNORE_INDEX
    candidates = valid & (ids >= 5)
    assert not (selected & ~candidates).any()  # never special tokens or padding
    assert (labels[selected] == ids[selected]).all()
    assert abs(selected.sum() / candidates.sum() - 0.15) < 0.01
    assert (selected.sum(1) >= 1).all()
    masked = selected & (inputs == tokenizer.mask_id)
    kept = selected & (inputs == ids)
    randomised = selected & ~masked & ~kept
    total = selected.sum()
    assert abs(masked.sum() / total - 0.8) < 0.02
    assert abs(kept.sum() / total - 0.1) < 0.02
    assert abs(randomised.sum() / total - 0.1) < 0.02
    assert (inputs[randomised] >= 5).all()  # random replacements are never special tokens
    assert (inputs[~selected] == ids[~selected]).all()


def test_budget_is_exact_per_row():
    rng = np.random.default_rng(3)
    candidates = rng.random((64, 50)) < rng.random((64, 1))
    candidates[0] = False
    selected = select_tokens(candidates, 0.15, rng)
    counts = candidates.sum(1)
    want = np.where(counts > 0, np.maximum(1, np.rint(0.15 * counts)), 0)
    assert selected.sum(1).tolist() == want.tolist()
    assert not (selected & ~candidates).any()


def test_reproducible_with_seed(tokenizer):
    ids, valid, _ = make_batch(np.random.default_rng(0), batch=64)
    masker = Masker(tokenizer, 0.15)
    a = masker(ids, valid, np.random.default_rng([7, 0, 3]))
    b = masker(ids, valid, np.random.default_rng([7, 0, 3]))
    c = masker(ids, valid, np.random.default_rng([7, 0, 4]))
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert not (a[1] == c[1]).all()


def test_whole_word_masking_masks_whole_words(tokenizer):
    ids, valid, word = make_batch(np.random.default_rng(5), batch=512, pieces=True)
    masker = Masker(tokenizer, 0.15, whole_word_masking=True)
    _, labels = masker(ids, valid, np.random.default_rng(2))
    selected = labels != IGNORE_INDEX
    for b in range(len(ids)):
        chosen = set(word[b][selected[b]])
        assert chosen, "every row masks at least one word"
        for w in chosen:
            assert selected[b][word[b] == w].all(), "a word is masked whole or not at all"
    candidates = valid & (ids >= 5)
    assert abs(selected.sum() / candidates.sum() - 0.15) < 0.02


def test_missing_mask_token_is_a_user_error(tmp_path):
    path = tmp_path / "nomask_vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\n", encoding="utf-8")
    tok = load_tokenizer({"type": "wordpiece", "vocab": str(path)})
    with pytest.raises(UserError, match=r"(?s)nomask_vocab\.txt.*\[MASK\]|\[MASK\].*nomask_vocab\.txt"):
        MlmObjective(MlmObjective.Config(), tok)
    with pytest.raises(UserError, match=r"\[MASK\]"):
        BertObjective(BertObjective.Config(), tok)
