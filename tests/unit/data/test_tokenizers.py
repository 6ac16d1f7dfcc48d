"""Tests for pentad.data.tokenizers.

Ids are checked against independent references built from the same files, with no download:
Hugging Face's pure-Python ``BertTokenizerLegacy`` for WordPiece, ``GPT2Tokenizer`` plus a small
pure-Python BPE written here for GPT-2, and the ``sentencepiece`` processor itself. The real
vocabularies come from TencentPretrain (``../shared/data/tencentpretrain/models``); tests that
need them skip when that folder is absent.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from pentad.data.tokenizers import (
    ROLES,
    ByteLevelBPETokenizer,
    CharTokenizer,
    SentencePieceTokenizer,
    SpaceTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    load_tokenizer,
)
from pentad.errors import UserError
from pentad.registry import TOKENIZERS

DATA = Path(__file__).parents[3] / "../shared/data/tencentpretrain"
MODELS = DATA / "models"
CORPORA = DATA / "corpora"

EN_TEXTS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé Ångström façade Über ÉCOLE",
    "unaffable running jumped antidisestablishmentarianism",
    "Numbers: 3.14159, 1,000,000 and 42nd; e-mail: a.b@example.com (really?) #tag $5 100%",
    "  leading and trailing spaces \t tabs\nnewlines\r\n",
    "Special [MASK] and [CLS] tokens[SEP]in text, [mask] lower, [UNK]",
    "Emoji 😀 and symbols © ™ ∑ and control\x00chars\x07 here \ufffd",
    "x" * 150 + " short",
    "",
    "Mixed 中文 English 日本語 한국어 ελληνικά русский",
    "don't can't I'm we'll they've O'Neil",
]
ZH_TEXTS = [
    "北京是中国的首都。",
    "我爱自然语言处理！NLP很有趣，对吧？",
    "２０２４年全角数字和ＡＢＣ，半角123abc",
    "《红楼梦》是曹雪芹的作品……「引号」『书名』",
    "Unicode行分隔\u2028符和不换行\u00a0空格",
    "生僻字𠀀𪚥和表情😀以及日文かな",
    "繁體中文測試：資料庫與網際網路",
]


def _corpus_lines(name: str, count: int) -> list[str]:
    with open(CORPORA / name, encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(count), handle)]


@pytest.fixture(scope="module")
def models() -> Path:
    if not MODELS.is_dir():
        pytest.skip(f"TencentPretrain models not found at {MODELS}")
    return MODELS


@pytest.fixture(scope="module")
def gpt2_json_dir(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vocab.json + merges.txt derived from TencentPretrain's text files (id = line index)."""
    directory = tmp_path_factory.mktemp("gpt2_json")
    tokens = (models / "huggingface_gpt2_vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    vocab = {token: index for index, token in enumerate(tokens)}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    shutil.copy(models / "huggingface_gpt2_merges.txt", directory / "merges.txt")
    return directory


@pytest.fixture(scope="module")
def bpe(models: Path) -> ByteLevelBPETokenizer:
    return load_tokenizer(
        {"type": "bpe", "vocab": "huggingface_gpt2_vocab.txt", "merges": "huggingface_gpt2_merges.txt"},
        base_dir=models,
    )


@pytest.fixture(scope="module")
def uncased(models: Path) -> WordPieceTokenizer:
    return WordPieceTokenizer(models / "google_uncased_en_vocab.txt")


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# WordPiece against Hugging Face's pure-Python BERT tokenizer


def _legacy_bert(vocab: Path, **kwargs):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    return BertTokenizerLegacy(vocab_file=str(vocab), **kwargs)


@pytest.mark.parametrize(
    ("vocab", "options", "reference_options"),
    [
        ("google_uncased_en_vocab.txt", {}, {"do_lower_case": True}),
        ("google_cased_en_vocab.txt", {"lowercase": False}, {"do_lower_case": False}),
        ("google_uncased_en_vocab.txt", {"strip_accents": False}, {"do_lower_case": True, "strip_accents": False}),
        ("google_zh_vocab.txt", {}, {"do_lower_case": True}),
        ("google_zh_vocab.txt", {"lowercase": False}, {"do_lower_case": False}),
        ("google_zh_vocab.txt", {"split_cjk": False}, {"do_lower_case": True, "tokenize_chinese_chars": False}),
    ],
)
def test_wordpiece_matches_reference_bert_tokenizer(models: Path, vocab, options, reference_options):
    ours = load_tokenizer({"type": "wordpiece", "vocab": vocab, **options}, base_dir=models)
    reference = _legacy_bert(models / vocab, **reference_options)
    texts = EN_TEXTS + ZH_TEXTS + _corpus_lines("news-commentary-v13-en-zh_sampled.txt", 60)
    for text in texts:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False), text
    assert ours.encode_batch(texts) == [ours.encode(text) for text in texts]


def test_wordpiece_on_chinese_corpus_lines(models: Path):
    ours = WordPieceTokenizer(models / "google_zh_vocab.txt")
    reference = _legacy_bert(models / "google_zh_vocab.txt", do_lower_case=True)
    lines = _corpus_lines("CLUECorpusSmall_bert_sampled.txt", 80)
    assert ours.encode_batch(lines) == [reference.encode(line, add_special_tokens=False) for line in lines]


def test_wordpiece_tokens_specials_and_decode(uncased: WordPieceTokenizer):
    assert uncased.tokenize("Unaffable café!") == ["una", "##ffa", "##ble", "cafe", "!"]
    assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id) == (0, 100, 101, 102, 103)
    assert (uncased.bos_id, uncased.eos_id) == (101, 102)  # no bos/eos of their own: cls/sep
    assert uncased.vocab_size == 30522
    assert uncased.token_to_id("hello") == 7592 and uncased.token_to_id("no-such-token") is None
    assert uncased.id_to_token(7592) == "hello"
    with pytest.raises(IndexError):
        uncased.id_to_token(30522)
    ids = uncased.encode("Hello [MASK] world, unaffable.")
    assert uncased.decode(ids) == "hello [MASK] world, unaffable."
    assert uncased.decode(np.array(ids), skip_special_tokens=True) == "hello world, unaffable."
    with pytest.raises(IndexError):
        uncased.decode([5, 99999])


def test_wordpiece_word_starts(uncased: WordPieceTokenizer):
    ids = uncased.encode("unaffable running [MASK] jumped")
    tokens = uncased.tokenize("unaffable running [MASK] jumped")
    assert tokens == ["una", "##ffa", "##ble", "running", "[MASK]", "jumped"]
    assert uncased.word_starts(ids).tolist() == [True, False, False, True, True, True]
    # A sequence cut mid-word still starts with a word; any leading shape is kept.
    batch = np.array([ids[1:], ids[:-1]])
    starts = uncased.word_starts(batch)
    assert starts.shape == batch.shape and starts.dtype == bool
    assert starts[0].tolist() == [True, False, True, True, True]
    assert uncased.word_starts([]).shape == (0,)


# --------------------------------------------------------------------------------------------
# GPT-2 byte-level BPE


def _reference_bpe(text: str, vocab: dict[str, int], ranks: dict[tuple[str, str], int]) -> list[int]:
    """GPT-2's algorithm in plain Python: regex split, bytes to symbols, merge the best pair."""
    import regex

    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbol = {b: chr(b) for b in printable}
    for offset, b in enumerate(b for b in range(256) if b not in printable):
        symbol[b] = chr(256 + offset)
    pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    ids: list[int] = []
    for piece in pattern.findall(text):
        word = [symbol[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            rank, i = min((ranks.get(pair, float("inf")), i) for i, pair in enumerate(zip(word, word[1:])))
            if rank == float("inf"):
                break
            word[i : i + 2] = [word[i] + word[i + 1]]
        ids += [vocab[w] for w in word]
    return ids


BPE_TEXTS = [t for t in EN_TEXTS if "[" not in t] + [
    "Hello world",
    "\n\nParagraphs\n\n\nand   multiple    spaces  ",
    "  indented code:\n\tif x:\n\t\treturn 1",
    "日本語のテキストと中文",
]


def test_bpe_matches_known_ids_and_python_reference(models: Path, bpe: ByteLevelBPETokenizer):
    # The TencentPretrain file is GPT-2's vocabulary in fairseq (RoBERTa) order.
    assert bpe.encode("Hello world") == [31414, 232]
    assert bpe.vocab_size == 50265
    tokens = (models / "huggingface_gpt2_vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = (models / "huggingface_gpt2_merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]
    ranks = {tuple(line.split(" ")): rank for rank, line in enumerate(merges)}
    for text in BPE_TEXTS:
        assert bpe.encode(text) == _reference_bpe(text, vocab, ranks), text


def test_bpe_matches_hf_gpt2_tokenizer(gpt2_json_dir: Path, bpe: ByteLevelBPETokenizer):
    from transformers import GPT2Tokenizer

    reference = GPT2Tokenizer.from_pretrained(str(gpt2_json_dir))
    from_json = load_tokenizer({"type": "bpe", "vocab": "vocab.json", "merges": "merges.txt"}, base_dir=gpt2_json_dir)
    texts = BPE_TEXTS + ["a <|endoftext|> b<|endoftext|>"] + _corpus_lines("news-commentary-v13-en-zh_sampled.txt", 80)
    expected = [reference.encode(text, add_special_tokens=False) for text in texts]
    assert bpe.encode_batch(texts) == expected
    assert from_json.encode_batch(texts) == expected
    assert from_json.special_tokens == bpe.special_tokens
    assert from_json.fingerprint() != bpe.fingerprint()  # different files, same vocabulary


def test_bpe_specials_decode_and_word_starts(bpe: ByteLevelBPETokenizer):
    eot = 50260
    assert (bpe.bos_id, bpe.eos_id, bpe.cls_id, bpe.sep_id) == (eot, eot, eot, eot)
    assert (bpe.pad_id, bpe.mask_id, bpe.unk_id) == (1, 50264, 3)  # RoBERTa's <pad>, <mask>, <unk>
    for text in BPE_TEXTS:
        assert bpe.decode(bpe.encode(text)) == text
    text = "Hello world, foo\n\nbar<|endoftext|>x"
    ids = bpe.encode(text)
    assert bpe.tokenize(text) == ["Hello", "Ġworld", ",", "Ġfoo", "Ċ", "Ċ", "bar", "<|endoftext|>", "x"]
    assert bpe.word_starts(ids).tolist() == [True, True, False, True, True, True, True, True, True]
    assert bpe.decode(ids, skip_special_tokens=True) == "Hello world, foo\n\nbarx"


def test_bpe_special_token_override(models: Path):
    roberta = ByteLevelBPETokenizer(
        models / "huggingface_gpt2_vocab.txt",
        models / "huggingface_gpt2_merges.txt",
        special_tokens={"bos": "<s>", "eos": "</s>", "cls": "<s>", "sep": "</s>"},
    )
    assert (roberta.bos_id, roberta.eos_id, roberta.cls_id, roberta.sep_id, roberta.pad_id) == (0, 2, 0, 2, 1)
    assert roberta.encode("<s>Hello world</s>") == [0, 31414, 232, 2]


# --------------------------------------------------------------------------------------------
# char, space, sentencepiece


SMALL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "北", "京", "a", "b", "hello", "world"]


def test_char_tokenizer(tmp_path: Path):
    tok = load_tokenizer({"type": "char", "vocab": str(_write(tmp_path / "vocab.txt", SMALL_VOCAB))})
    assert isinstance(tok, CharTokenizer)
    assert tok.tokenize(" 北 京a\tcb\n") == ["北", "京", "a", "[UNK]", "b"]
    assert tok.encode(" 北 京a\tcb\n") == [5, 6, 7, 1, 8]
    assert tok.decode([5, 6, 7, 1, 8]) == "北京a[UNK]b"
    assert tok.word_starts([5, 6, 7]).all()
    assert (tok.pad_id, tok.unk_id, tok.mask_id) == (0, 1, 4)


def test_char_tokenizer_on_corpus_matches_python(models: Path):
    tok = CharTokenizer(models / "google_zh_vocab.txt")
    vocab = {t: i for i, t in enumerate((models / "google_zh_vocab.txt").read_text(encoding="utf-8").split("\n"))}
    lines = _corpus_lines("CLUECorpusSmall_bert_sampled.txt", 100)
    expected = [[vocab.get(ch, tok.unk_id) for ch in line if not ch.isspace()] for line in lines]
    assert tok.encode_batch(lines) == expected


def test_space_tokenizer(tmp_path: Path):
    tok = load_tokenizer({"type": "space", "vocab": str(_write(tmp_path / "vocab.txt", SMALL_VOCAB))})
    assert isinstance(tok, SpaceTokenizer)
    assert tok.tokenize("hello  world\tfoo\n北") == ["hello", "world", "[UNK]", "北"]
    assert tok.encode("hello  world\tfoo\n北") == [9, 10, 1, 5]
    assert tok.decode([9, 10, 1]) == "hello world [UNK]"


# --------------------------------------------------------------------------------------------
# special tokens typed literally in the text: parse (default) or split (TencentPretrain's way)

LITERAL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", "cls", "sep", "mask", "hello", "world",
                 "C", "L", "S"]
LITERAL_TEXT = "hello [CLS] world[SEP] x[MASK] [mask]"


def _tp_basic_wordpiece(text: str, vocab: list[str]) -> list[int]:
    """TencentPretrain's BertTokenizer on this vocabulary (whole words only): lower-case, split on
    whitespace and punctuation, look each piece up; nothing is special."""
    import re

    index = {t: i for i, t in enumerate(vocab)}
    return [index.get(piece, index["[UNK]"]) for piece in re.findall(r"\w+|[^\w\s]", text.lower())]


@pytest.mark.parametrize("kind", ["wordpiece", "char", "space"])
def test_special_tokens_in_text_parse_or_split(tmp_path: Path, kind: str):
    vocab = _write(tmp_path / "vocab.txt", LITERAL_VOCAB)
    index = {t: i for i, t in enumerate(LITERAL_VOCAB)}
    default = load_tokenizer({"type": kind, "vocab": str(vocab)})
    parse = load_tokenizer({"type": kind, "vocab": str(vocab), "special_tokens_in_text": "parse"})
    split = load_tokenizer({"type": kind, "vocab": str(vocab), "special_tokens_in_text": "split"})
    assert default.config().special_tokens_in_text == "parse"
    assert default.encode(LITERAL_TEXT) == parse.encode(LITERAL_TEXT)
    assert default.fingerprint() == parse.fingerprint() != split.fingerprint()  # old datasets stay valid
    assert index["[CLS]"] in parse.encode(LITERAL_TEXT)
    ids = split.encode(LITERAL_TEXT)
    unk = index["[UNK]"]
    if kind == "wordpiece":  # TencentPretrain's bert tokenizer: '[', 'cls', ']'
        assert ids == _tp_basic_wordpiece(LITERAL_TEXT, LITERAL_VOCAB)
        assert split.tokenize("[CLS]") == ["[", "cls", "]"]
    elif kind == "char":  # TencentPretrain's char tokenizer: one token per character
        assert ids == [index.get(ch, unk) for ch in LITERAL_TEXT if not ch.isspace()]
    else:  # TencentPretrain's space tokenizer looks every whitespace-separated word up
        assert ids == [index.get(word, unk) for word in LITERAL_TEXT.split()]
        assert ids[1] == index["[CLS]"] and parse.encode("x[MASK]") == [unk, index["[MASK]"]] != split.encode("x[MASK]")
    if kind != "space":
        assert not set(ids) & {index["[CLS]"], index["[SEP]"], index["[MASK]"]}
    assert split.encode_batch([LITERAL_TEXT, "[SEP]"]) == [ids, split.encode("[SEP]")]
    # The choice survives saving into a run directory and pickling into loader workers.
    again = load_tokenizer(split.save(tmp_path / "run"), base_dir=tmp_path / "run")
    assert again.encode(LITERAL_TEXT) == ids and again.fingerprint() == split.fingerprint()
    assert pickle.loads(pickle.dumps(split)).encode(LITERAL_TEXT) == ids
    assert pickle.loads(pickle.dumps(parse)).encode(LITERAL_TEXT) == parse.encode(LITERAL_TEXT)
    # Special ids inserted by objectives and tasks are unaffected.
    assert (split.cls_id, split.sep_id, split.mask_id) == (index["[CLS]"], index["[SEP]"], index["[MASK]"])
    with pytest.raises(UserError):
        load_tokenizer({"type": kind, "vocab": str(vocab), "special_tokens_in_text": "keep"})


def test_special_tokens_in_text_bpe_and_tokenizer_json(models: Path, tmp_path: Path):
    text = "bar<|endoftext|>x"
    options = {"type": "bpe", "vocab": "huggingface_gpt2_vocab.txt", "merges": "huggingface_gpt2_merges.txt"}
    parse = load_tokenizer(options, base_dir=models)
    split = load_tokenizer({**options, "special_tokens_in_text": "split"}, base_dir=models)
    assert parse.bos_id in parse.encode(text)
    ids = split.encode(text)  # TencentPretrain's GPT-2 regex splits it: '<|', 'endoftext', '|>'
    assert parse.bos_id not in ids and split.decode(ids) == text and len(ids) > 3
    assert ids == parse.encode("bar") + parse.encode("<|") + parse.encode("endoftext") + parse.encode("|>x")
    from tokenizers import Tokenizer as Backend
    from tokenizers import models as backend_models
    from tokenizers import pre_tokenizers

    backend = Backend(backend_models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "s": 3, "<": 4, ">": 5},
                                               unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tokenizer.json").write_text(backend.to_str(), encoding="utf-8")
    json_split = load_tokenizer({"type": "tokenizer_json", "file": str(tmp_path / "tokenizer.json"),
                                 "special_tokens_in_text": "split"})
    json_parse = load_tokenizer({"type": "tokenizer_json", "file": str(tmp_path / "tokenizer.json")})
    assert json_parse.encode("<s> s") == [1, 3] and json_split.encode("<s> s") == [4, 3, 5, 3]  # the file's split


def test_sentencepiece_matches_processor(models: Path):
    import sentencepiece

    path = models / "cluecorpussmall_spm.model"
    tok = load_tokenizer({"type": "sentencepiece", "model": str(path)})
    reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
    texts = ZH_TEXTS + EN_TEXTS + _corpus_lines("CLUECorpusSmall_bert_sampled.txt", 50)
    assert tok.encode_batch(texts) == [reference.encode(t) for t in texts]
    assert [tok.tokenize(t) for t in texts[:5]] == [reference.encode(t, out_type=str) for t in texts[:5]]
    assert tok.vocab_size == reference.get_piece_size() == 100000
    ids = {role: getattr(tok, f"{role}_id") for role in ROLES}
    assert ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4, "bos": 2, "eos": 3}
    assert tok.decode(tok.encode("北京是中国的首都。")) == "北京是中国的首都。"
    assert tok.token_to_id("[MASK]") == 4 and tok.token_to_id("no-such-piece") is None
    # '▁' alone begins the word its next piece continues.
    assert tok.tokenize("北京 是 hello world") == ["▁北京", "▁", "是", "▁", "hello", "▁world"]
    assert tok.word_starts(tok.encode("北京 是 hello world")).tolist() == [True, True, False, True, False, True]


def test_sentencepiece_model_ids_and_fallbacks(models: Path):
    tok = SentencePieceTokenizer(models / "sentencepiece.bpe.model")
    # <s>=0 <pad>=1 </s>=2 <unk>=3; no mask piece; cls/sep borrow bos/eos.
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.cls_id, tok.sep_id) == (1, 3, 0, 2, 0, 2)
    assert tok.mask_id is None


# --------------------------------------------------------------------------------------------
# Interface-wide: registry, save/reload, fingerprint, pickling


def _all_tokenizers(models: Path, tmp_path: Path) -> list[Tokenizer]:
    return [
        WordPieceTokenizer(models / "google_zh_vocab.txt", lowercase=False),
        ByteLevelBPETokenizer(models / "huggingface_gpt2_vocab.txt", models / "huggingface_gpt2_merges.txt"),
        CharTokenizer(models / "google_zh_vocab.txt", special_tokens={"mask": "[unused1]"}),
        SpaceTokenizer(_write(tmp_path / "space_vocab.txt", SMALL_VOCAB)),
        SentencePieceTokenizer(models / "cluecorpussmall_spm.model"),
    ]


def test_registry_has_every_tokenizer():
    assert {"wordpiece", "bpe", "char", "space", "sentencepiece"} <= set(TOKENIZERS.names())
    for name in ("wordpiece", "bpe", "char", "space", "sentencepiece"):
        assert TOKENIZERS.config_class(name).model_fields["type"].default == name


def test_save_reload_fingerprint_and_pickle(models: Path, tmp_path: Path):
    texts = ["Hello world 北京 [MASK] café", "hello world a b", *ZH_TEXTS[:2]]
    for tok in _all_tokenizers(models, tmp_path):
        target = tmp_path / "saved" / tok.registry_name
        cfg = tok.save(target)
        assert cfg["type"] == tok.registry_name
        for field in tok._path_fields:
            assert "/" not in cfg[field] and (target / cfg[field]).is_file()
        json.dumps(cfg)  # plain data, ready for config.yaml
        reloaded = load_tokenizer(cfg, base_dir=target)
        copy = pickle.loads(pickle.dumps(tok))
        for other in (reloaded, copy):
            assert type(other) is type(tok)
            assert other.fingerprint() == tok.fingerprint()
            assert other.encode_batch(texts) == tok.encode_batch(texts)
            assert other.special_tokens == tok.special_tokens
            assert other.vocab_size == tok.vocab_size


def test_fingerprint_depends_on_bytes_and_options_not_paths(models: Path, tmp_path: Path):
    vocab = models / "google_zh_vocab.txt"
    moved = tmp_path / "elsewhere" / "renamed.txt"
    moved.parent.mkdir()
    shutil.copy(vocab, moved)
    base = WordPieceTokenizer(vocab)
    assert WordPieceTokenizer(moved).fingerprint() == base.fingerprint()
    assert WordPieceTokenizer(vocab, lowercase=False).fingerprint() != base.fingerprint()
    # Pinned: a change here changes every dataset's recorded tokenizer identity.
    assert base.fingerprint() == "407a09a7e7eb65e4f48eafc70912a3b8c1dbd6fe9e27b3eeddd59f82394f14d1"
    with open(moved, "a", encoding="utf-8") as handle:
        handle.write("[extra]\n")
    assert WordPieceTokenizer(moved).fingerprint() != base.fingerprint()


def test_from_config_object_and_relative_paths(models: Path):
    cfg = WordPieceTokenizer.Config(vocab=Path("google_uncased_en_vocab.txt"), lowercase=True)
    tok = load_tokenizer(cfg, base_dir=models)
    assert isinstance(tok, WordPieceTokenizer) and tok.encode("hello") == [7592]
    assert tok.config().vocab == models / "google_uncased_en_vocab.txt"


# --------------------------------------------------------------------------------------------
# Errors


def test_missing_and_empty_vocab_files(tmp_path: Path):
    with pytest.raises(UserError, match="nope.txt"):
        load_tokenizer({"type": "wordpiece", "vocab": "nope.txt"}, base_dir=tmp_path)
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"empty\.txt is empty"):
        load_tokenizer({"type": "char", "vocab": str(tmp_path / "empty.txt")})
    with pytest.raises(UserError, match="merges.txt does not exist"):
        ByteLevelBPETokenizer(_write(tmp_path / "v.txt", ["a"]), tmp_path / "merges.txt")


def test_malformed_vocab_lines(tmp_path: Path):
    with pytest.raises(UserError, match=r"dup\.txt, line 3: token 'a' already appears on line 1"):
        WordPieceTokenizer(_write(tmp_path / "dup.txt", ["a", "[UNK]", "a"]))
    with pytest.raises(UserError, match=r"gap\.txt, line 2: the line is empty"):
        WordPieceTokenizer(_write(tmp_path / "gap.txt", ["a", "", "[UNK]"]))
    (tmp_path / "bad.json").write_text('{"a": 0, "b": 0}', encoding="utf-8")
    with pytest.raises(UserError, match="share id 0"):
        ByteLevelBPETokenizer(tmp_path / "bad.json", _write(tmp_path / "m.txt", []))
    (tmp_path / "latin1.txt").write_bytes("[UNK]\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.txt, line 2: not valid UTF-8"):
        WordPieceTokenizer(tmp_path / "latin1.txt")


def test_vocab_without_mask_or_unk(tmp_path: Path):
    tok = WordPieceTokenizer(_write(tmp_path / "v.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"]))
    assert tok.mask_id is None and (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id) == (0, 1, 2, 3)
    assert tok.encode("hello there") == [4, 1]
    with pytest.raises(UserError, match=r"no unknown token"):
        WordPieceTokenizer(_write(tmp_path / "nounk.txt", ["[PAD]", "hello"]))
    # Naming the unknown token fixes it.
    fixed = WordPieceTokenizer(_write(tmp_path / "u.txt", ["<unk>", "hello"]), special_tokens={"unk": "<unk>"})
    assert fixed.encode("hello there") == [1, 0]


def test_bad_special_token_overrides(tmp_path: Path):
    vocab = _write(tmp_path / "v.txt", SMALL_VOCAB)
    with pytest.raises(UserError, match=r"'msk'.*did you mean 'mask'"):
        load_tokenizer({"type": "wordpiece", "vocab": str(vocab), "special_tokens": {"msk": "[MASK]"}})
    with pytest.raises(UserError, match=r"'msk'"):
        WordPieceTokenizer(vocab, special_tokens={"msk": "[MASK]"})
    with pytest.raises(UserError, match=r"mask='<mask>'.*not in the vocabulary"):
        load_tokenizer({"type": "space", "vocab": str(vocab), "special_tokens": {"mask": "<mask>"}})
    tok = WordPieceTokenizer(vocab, special_tokens={"mask": "world"})
    assert tok.mask_id == 10 and tok.encode("world") == [10]
    assert set(ROLES) == set(tok.special_tokens)


def test_malformed_merges(tmp_path: Path):
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "Ġ": 3}), encoding="utf-8")
    with pytest.raises(UserError, match=r"m1\.txt, line 3: expected two tokens"):
        ByteLevelBPETokenizer(vocab, _write(tmp_path / "m1.txt", ["#version: 0.2", "a b", "a b c"]))
    with pytest.raises(UserError, match=r"m2\.txt, line 1: .*token 'c', which is not in the vocabulary"):
        ByteLevelBPETokenizer(vocab, _write(tmp_path / "m2.txt", ["a c"]))
    tok = ByteLevelBPETokenizer(vocab, _write(tmp_path / "m3.txt", ["#version: 0.2", "a b"]))
    assert tok.encode("ab a") == [2, 3, 0] and tok.eos_id is None


def test_bad_configs(tmp_path: Path):
    with pytest.raises(UserError, match="did you mean 'wordpiece'"):
        load_tokenizer({"type": "wordpeice", "vocab": "v.txt"})
    with pytest.raises(UserError, match="no 'type' key"):
        load_tokenizer({"vocab": "v.txt"})
    with pytest.raises(UserError, match=r"tokenizer\.lowercse.*did you mean 'lowercase'"):
        load_tokenizer({"type": "wordpiece", "vocab": "v.txt", "lowercse": False})
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(UserError, match="garbage.model could not be read"):
        load_tokenizer({"type": "sentencepiece", "model": str(garbage)})


def test_tokenizer_json_runs_the_file_as_written_and_saves_beside_a_run_config(tmp_path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "hello": 4, "world": 5},
                                         unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tokenizer.json").write_text(backend.to_str(), encoding="utf-8")
    tok = load_tokenizer({"type": "tokenizer_json", "file": str(tmp_path / "tokenizer.json")})
    assert tok.encode("hello there world") == [4, 0, 5]
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id, tok.cls_id, tok.sep_id) == (0, 1, 2, 3, 1, 2)
    # A run directory's tokenizer/tokenizer.json is pentad's config: the file is saved under another name.
    cfg = tok.save(tmp_path / "run")
    assert cfg["file"] == "file-tokenizer.json"
    again = load_tokenizer(cfg, base_dir=tmp_path / "run")
    assert again.fingerprint() == tok.fingerprint()
    (tmp_path / "bad.json").write_text('{"model": 1', encoding="utf-8")
    with pytest.raises(UserError, match="bad.json could not be read by the tokenizers library"):
        load_tokenizer({"type": "tokenizer_json", "file": str(tmp_path / "bad.json")})


def test_sentencepiece_albert_normalisation_options(tmp_path: Path):
    import io

    import sentencepiece as spm

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["the cafe is naive and quoted \" here"] * 50),
                                   model_writer=buffer, vocab_size=30, hard_vocab_limit=False, minloglevel=2)
    (tmp_path / "m.model").write_bytes(buffer.getvalue())
    plain = load_tokenizer({"type": "sentencepiece", "model": str(tmp_path / "m.model")})
    albert = load_tokenizer({"type": "sentencepiece", "model": str(tmp_path / "m.model"), "lowercase": True,
                             "strip_accents": True, "replace_quotes": True})
    assert albert.encode("The Café is NAÏVE ``here''") == plain.encode('the cafe is naive "here"')
    assert plain.encode("Café") != plain.encode("cafe")
    assert albert.fingerprint() != plain.fingerprint()


def test_offsets_map_tokens_back_to_the_text(models: Path, uncased: WordPieceTokenizer, bpe: ByteLevelBPETokenizer,
                                             tmp_path: Path):
    """encode_with_offsets gives encode's ids and, per token, the characters of the original text it covers
    (lower-casing, accent stripping and CJK splitting included); sentencepiece says it has none."""
    zh = WordPieceTokenizer(models / "google_zh_vocab.txt")
    text = "《战国无双3》是由光荣和ω-force开发的 Hello  Ünïcode 1998年"
    ids, offsets = zh.encode_with_offsets(text)
    assert ids == zh.encode(text)
    pieces = [text[b:e] for b, e in offsets]
    assert pieces[:7] == ["《", "战", "国", "无", "双", "3", "》"]
    assert pieces[-4:] == ["Hello", "Ünïcode", "1998", "年"]
    for tok in (uncased, bpe, CharTokenizer(models / "google_zh_vocab.txt")):
        for line in EN_TEXTS + ZH_TEXTS:
            ids, offsets = tok.encode_with_offsets(line)
            assert ids == tok.encode(line) and len(offsets) == len(ids)
            assert all(0 <= b <= e <= len(line) for b, e in offsets)
            assert [b for b, _ in offsets] == sorted(b for b, _ in offsets)
    _, offsets = uncased.encode_with_offsets("Playing HELLO")
    assert ["Playing HELLO"[b:e] for b, e in offsets][-1] == "HELLO"
    spm = load_tokenizer({"type": "sentencepiece", "model": str(models / "cluecorpussmall_spm.model")})
    with pytest.raises(UserError, match="does not give the character offsets"):
        spm.encode_with_offsets("北京")


# --------------------------------------------------------------------------------------------
# text outside the vocabulary: what encodes to the unknown id without being the unknown token


def test_unknown_text_per_tokenizer_kind(tmp_path: Path):
    import io

    import sentencepiece as spm

    vocab = _write(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "o", "n", "e", "t", "w",
                                            "one", "two", "##n", "##e", "##w", "##o"])
    wordpiece = load_tokenizer({"type": "wordpiece", "vocab": str(vocab)})
    # a character unknown by itself; a word whose characters are all known but cannot be split
    assert wordpiece.unknown_text("one twø øne") == ["ø"]
    assert wordpiece.unknown_text("one tent") == ["tent"]
    assert wordpiece.unknown_text("one [UNK] two") == [] and wordpiece.unknown_text("one two") == []
    split = load_tokenizer({"type": "wordpiece", "vocab": str(vocab), "special_tokens_in_text": "split"})
    assert split.unknown_text("one [UNK]") == ["[", "U", "K", "]"]  # not the token when specials are not parsed
    char = load_tokenizer({"type": "char", "vocab": str(vocab)})
    assert char.unknown_text("one xo x[UNK]") == ["x"]
    space = load_tokenizer({"type": "space", "vocab": str(vocab)})
    assert space.unknown_text("one twø one none") == ["twø", "none"]  # words: its unit
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["one two one two"] * 50), model_writer=buffer,
                                   vocab_size=12, hard_vocab_limit=False, minloglevel=2)
    (tmp_path / "m.model").write_bytes(buffer.getvalue())
    sp = load_tokenizer({"type": "sentencepiece", "model": str(tmp_path / "m.model")})
    assert sp.unknown_text("one twø") == ["ø"] and sp.unknown_text("two one") == []
    assert sp.unk_id in sp.encode("<unk>") and "<" in sp.unknown_text("<unk>")  # no literal unk in SentencePiece


# --------------------------------------------------------------------------------------------
# WordPiece's piece cache (encode_batch) against the Rust tokenizer run on whole texts

# Characters that stress the cut points: spaces of every kind, controls, combining marks (also right
# after an ideograph), CJK ideographs of every block (compatibility ones decompose under NFD),
# punctuation, case changes that lengthen (İ) or depend on context in other libraries (Σ), emoji.
_FUZZ_POOL = (
    list("ab Zé") + [" ", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u00a0", "\u2028",
                     "\u3000", "\u200b", "\x00", "\ufffd", "\u0301", "\u0308", "\u0327"]
    + list("中文北京是ㄅ𠀀𪚥豈更\uf900\ufa6d\U0002f800\u3400\u4dbf\u9fff\u9fa5")
    + list("，。！？《》…「」-'.,;:$#[]") + ["İ", "Σ", "ς", "ß", "Ǆ", "ﬁ", "Ａ", "１", "😀", "ı", "ά"]
    + ["[MASK]", "[CLS]", "[mask]", "[UNK]", "x" * 30, "naïve", "unaffable", "2024"]
)


def _fuzz_texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(_FUZZ_POOL[i] for i in rng.integers(0, len(_FUZZ_POOL), rng.integers(0, 24)))
            for _ in range(count)]


def _rust_whole(tokenizer: WordPieceTokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer._backend.encode_batch_fast(texts, add_special_tokens=False)]


@pytest.mark.parametrize("options", [
    {}, {"lowercase": False}, {"strip_accents": False}, {"split_cjk": False},
    {"special_tokens_in_text": "split"}, {"lowercase": False, "split_cjk": False, "max_input_chars_per_word": 8},
])
def test_wordpiece_piece_cache_gives_the_ids_of_whole_texts(models: Path, options):
    tokenizer = load_tokenizer({"type": "wordpiece", "vocab": "google_zh_vocab.txt", **options}, base_dir=models)
    texts = _fuzz_texts(3000, seed=len(str(options))) + EN_TEXTS + ZH_TEXTS
    expected = _rust_whole(tokenizer, texts)
    assert tokenizer.encode_batch(texts) == expected  # cold: every piece new
    assert tokenizer.encode_batch(texts) == expected  # warm: every piece cached
    assert [ids for i in range(0, len(texts), 7) for ids in tokenizer.encode_batch(texts[i:i + 7])] == expected
    assert tokenizer._piece_ids, "the cache was not used"


def test_wordpiece_piece_cache_on_corpora_and_when_full(models: Path, monkeypatch: pytest.MonkeyPatch):
    import pentad.data.tokenizers as module

    lines = [line for name in ("CLUECorpusSmall_sampled.txt", "news-commentary-v13-en-zh_sampled.txt",
                               "book_review_cls.txt") for line in _corpus_lines(name, 400)]
    tokenizer = WordPieceTokenizer(models / "google_zh_vocab.txt")
    expected = _rust_whole(tokenizer, lines)
    assert tokenizer.encode_batch(lines) == expected
    monkeypatch.setattr(module, "PIECE_CACHE_SIZE", 500)  # fills after the first batch or so
    small = WordPieceTokenizer(models / "google_zh_vocab.txt")
    assert [ids for i in range(0, len(lines), 50) for ids in small.encode_batch(lines[i:i + 50])] == expected
    assert 0 < len(small._piece_ids) <= 500


def test_wordpiece_every_cut_ideograph_is_a_word_of_its_own(models: Path):
    """The cut points the cache relies on: each ideograph of the blocks it cuts at is tokenized
    alone by the Rust tokenizer, whatever surrounds it, in every option that cuts there."""
    import pentad.data.tokenizers as module

    ranges = [(0x3400, 0x4DBF), (0x4E00, 0x9FFF)]
    assert module._CJK == "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges).encode().decode("unicode_escape")
    chars = [chr(c) for a, b in ranges for c in range(a, b + 1)]
    for options in ({}, {"lowercase": False}):
        tokenizer = load_tokenizer({"type": "wordpiece", "vocab": "google_zh_vocab.txt", **options}, base_dir=models)
        alone = _rust_whole(tokenizer, chars)
        around = _rust_whole(tokenizer, [f"ab{c}\u0301cd" for c in chars])
        ab, cd = tokenizer._backend.encode("ab").ids, tokenizer._backend.encode("\u0301cd").ids
        assert all(len(ids) == 1 for ids in alone)
        assert around == [ab + ids + cd for ids in alone]


def test_wordpiece_pickle_leaves_the_piece_cache_behind(models: Path):
    tokenizer = WordPieceTokenizer(models / "google_zh_vocab.txt")
    tokenizer.encode_batch(ZH_TEXTS)
    assert tokenizer._piece_ids
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy._piece_ids == {}
    assert copy.encode_batch(ZH_TEXTS) == tokenizer.encode_batch(ZH_TEXTS)
    del copy.__dict__["_piece_ids"]  # a tokenizer pickled before the cache existed
    assert copy.encode_batch(ZH_TEXTS) == tokenizer.encode_batch(ZH_TEXTS)


def test_wordpiece_piece_cache_with_special_tokens_across_cuts(tmp_path: Path):
    """A special token with a space or an ideograph inside is matched in raw text before any cut:
    texts holding one go to the Rust tokenizer whole, the others through the cache."""
    vocab = _write(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<m 1>", "遮x", "a", "b", "遮", "x",
                                            "<", ">", "m", "1"])
    tokenizer = load_tokenizer({"type": "wordpiece", "vocab": str(vocab),
                                "special_tokens": {"mask": "<m 1>", "bos": "遮x"}})
    texts = ["a <m 1> b", "a<m 1>b 遮x", "遮 x <m1>", "a b", "<m 1>", "x遮xa", ""] + _fuzz_texts(300, seed=3)
    expected = _rust_whole(tokenizer, texts)
    assert expected[0] == [6, 4, 7] and expected[1] == [6, 4, 7, 5]
    assert tokenizer.encode_batch(texts) == expected
    assert tokenizer.encode_batch(texts) == expected
