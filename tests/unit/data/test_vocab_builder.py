"""Tests for pentad.data.vocab_builder: trained vocabularies load in pentad and in Hugging Face."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from pentad.data.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer, load_tokenizer
from pentad.data.vocab_builder import build_vocab
from pentad.errors import UserError

CLUE = Path(__file__).parents[3] / "../shared/data/tencentpretrain/corpora/CLUECorpusSmall_bert_sampled.txt"

WORDS = (
    "the a of to and in is was for on with as by at from model data train token word piece byte "
    "learning language transformer attention layer vector running jumped quickly Paris London "
    "café naïve über 2024 3.14 don't it's"
).split()


def _english_corpus(path: Path, lines: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(lines):
            words = rng.choices(WORDS, k=rng.randint(4, 16))
            handle.write(" ".join(words).capitalize() + rng.choice([".", "!", "?", ","]) + "\n")
    return path


@pytest.fixture(scope="module")
def clue_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not CLUE.is_file():
        pytest.skip(f"CLUE corpus not found at {CLUE}")
    path = tmp_path_factory.mktemp("clue") / "corpus.txt"
    with open(CLUE, encoding="utf-8") as source, open(path, "w", encoding="utf-8") as target:
        target.writelines(itertools.islice(source, 2000))
    return path


def test_wordpiece_vocab_from_chinese_corpus(clue_corpus: Path, tmp_path: Path):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    out = tmp_path / "wp"
    cfg = build_vocab([clue_corpus], "wordpiece", 3000, out, show_progress=False)
    assert cfg == {
        "type": "wordpiece", "vocab": "vocab.txt", "lowercase": True, "split_cjk": True,
        "strip_accents": None, "max_input_chars_per_word": 100, "special_tokens": None,
        "special_tokens_in_text": "parse",
    }
    lines = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and lines[-1] == ""
    tok = load_tokenizer(cfg, base_dir=out)
    assert isinstance(tok, WordPieceTokenizer) and tok.vocab_size == 3000
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    text = clue_corpus.read_text(encoding="utf-8").split("\n")[:20]
    ids = tok.encode_batch(text)
    assert all(tok.unk_id not in seq for seq in ids)  # every corpus character is in the vocabulary
    # Hugging Face's reference BERT tokenizer reads the file and agrees.
    reference = BertTokenizerLegacy(vocab_file=str(out / "vocab.txt"), do_lower_case=True)
    assert ids == [reference.encode(line, add_special_tokens=False) for line in text]


def test_bpe_vocab_from_english_corpus(tmp_path: Path):
    from transformers import GPT2Tokenizer

    corpora = [_english_corpus(tmp_path / "a.txt", 1500, seed=1), _english_corpus(tmp_path / "b.txt", 1500, seed=2)]
    out = tmp_path / "bpe"
    cfg = build_vocab(corpora, "bpe", 400, out, lowercase=False, show_progress=False)
    assert cfg["type"] == "bpe" and (cfg["vocab"], cfg["merges"]) == ("vocab.json", "merges.txt")
    tok = load_tokenizer(cfg, base_dir=out)
    assert isinstance(tok, ByteLevelBPETokenizer)
    assert tok.vocab_size == 400 and tok.eos_id == tok.bos_id == 0 and tok.pad_id is None
    assert len(json.loads((out / "vocab.json").read_text(encoding="utf-8"))) == 400
    texts = ["The model was running quickly.", "Unseen: 日本語 😀 Ω\n\ttabs", "café über don't"]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text  # byte-level: nothing is unknown
    assert len(tok.encode("transformer attention")) < len("transformer attention")  # merges learned
    reference = GPT2Tokenizer.from_pretrained(str(out))
    assert tok.encode_batch(texts) == [reference.encode(t, add_special_tokens=False) for t in texts]


def test_lowercase_option_reaches_the_tokenizer(tmp_path: Path):
    corpus = _english_corpus(tmp_path / "c.txt", 300)
    cfg = build_vocab([corpus], "bpe", 300, tmp_path / "lower", lowercase=True, show_progress=False)
    tok = load_tokenizer(cfg, base_dir=tmp_path / "lower")
    assert cfg["lowercase"] is True and tok.encode("PARIS") == tok.encode("paris")


def test_build_vocab_errors(tmp_path: Path):
    corpus = _english_corpus(tmp_path / "c.txt", 50)
    with pytest.raises(UserError, match="missing.txt does not exist"):
        build_vocab([tmp_path / "missing.txt"], "wordpiece", 100, tmp_path / "o")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"blank\.txt is empty"):
        build_vocab([corpus, tmp_path / "blank.txt"], "wordpiece", 100, tmp_path / "o")
    with pytest.raises(UserError, match="no corpus files"):
        build_vocab([], "bpe", 1000, tmp_path / "o")
    with pytest.raises(UserError, match="unknown vocabulary kind 'unigram'"):
        build_vocab([corpus], "unigram", 100, tmp_path / "o")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="vocab_size 100 is too small"):
        build_vocab([corpus], "bpe", 100, tmp_path / "o")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.txt failed"):
        build_vocab([tmp_path / "latin1.txt"], "wordpiece", 100, tmp_path / "o", show_progress=False)
    assert not (tmp_path / "o").exists()


def test_existing_vocabulary_is_never_overwritten(tmp_path: Path):
    corpus = _english_corpus(tmp_path / "c.txt", 50)
    out = tmp_path / "vocab"
    build_vocab([corpus], "wordpiece", 100, out, show_progress=False)
    before = (out / "vocab.txt").read_bytes()
    other = _english_corpus(tmp_path / "other.txt", 80, seed=1)
    with pytest.raises(UserError, match=r"already exists and is not empty \(vocab\.txt\)"):
        build_vocab([other], "wordpiece", 120, out, show_progress=False)
    with pytest.raises(UserError, match="already exists and is not empty"):
        build_vocab([other], "bpe", 300, out, show_progress=False)
    assert (out / "vocab.txt").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["vocab.txt"]
    with pytest.raises(UserError, match="exists and is not a directory"):
        build_vocab([other], "wordpiece", 100, corpus, show_progress=False)
    (tmp_path / "empty").mkdir()  # an empty directory is a fine place for a new vocabulary
    build_vocab([other], "wordpiece", 100, tmp_path / "empty", show_progress=False)
    assert (tmp_path / "empty" / "vocab.txt").is_file()


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import errno

    from pentad.data import vocab_builder

    corpus = _english_corpus(tmp_path / "c.txt", 50)

    def disk_full(backend, path):
        path.write_text("[PAD]\n")  # part of the file, then the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(vocab_builder, "_write_vocab_txt", disk_full)
    with pytest.raises(OSError):
        build_vocab([corpus], "wordpiece", 100, tmp_path / "out" / "vocab", show_progress=False)
    assert list((tmp_path / "out").iterdir()) == []  # no half-written vocabulary, no staging directory
    monkeypatch.undo()
    build_vocab([corpus], "wordpiece", 100, tmp_path / "out" / "vocab", show_progress=False)  # a retry works
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["vocab"]
