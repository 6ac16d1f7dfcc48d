"""Tokenizers of the Pegasus, BLOOM, Qwen2-MoE and ALBERT families through ``pentad convert``: pentad's
tokenizer of a converted directory gives the ids Hugging Face's tokenizer gives (tokenizers built
in the test, no download), and the export loads in HF with the same ids."""

from __future__ import annotations

import json

import pytest
from tests.parity.test_conversion_families import SENTENCES, hf_tokenizer, train_sentencepiece
from tests.unit.interop.helpers import ALBERT, BLOOM, PEGASUS, QWEN2_MOE, make_run

from pentad.interop import convert
from pentad.runs import load_run

transformers = pytest.importorskip("transformers")

TEXTS = ["The quick brown fox, hello world!", "a lazy dog eats food", "Über naïve café ÀÉÎ",
         "``Quoted'' text and  double  spaces", "UPPER case and MiXeD", "中文字符 and emoji 😀 too",
         "tabs\tand\nnewlines"]


def run_with_tokenizer(tmp_path, model, files: dict[str, bytes], tokenizer_config: dict):
    """A HF directory of ``model`` (exported from a random pentad run) with the given tokenizer files."""
    make_run(tmp_path / "run", model)
    convert("pentad-to-hf", tmp_path / "run", tmp_path / "hf")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / "hf" / name).unlink(missing_ok=True)
    for name, data in files.items():
        (tmp_path / "hf" / name).write_bytes(data)
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return hf_tokenizer(tmp_path / "hf")


def test_pegasus_ids_are_offset_by_103(tmp_path):
    data = train_sentencepiece(model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    theirs = run_with_tokenizer(tmp_path, PEGASUS, {"spiece.model": data}, {"tokenizer_class": "PegasusTokenizer"})
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    assert any("<unk_2>..<unk_102>" in n for n in report.notes)
    _, ours = load_run(tmp_path / "pentad")
    assert ours.vocab_size == len(theirs)
    assert ours.unk_id == theirs.unk_token_id == 105
    assert (ours.pad_id, ours.eos_id, ours.mask_id) == (theirs.pad_token_id, theirs.eos_token_id,
                                                        theirs.mask_token_id) == (0, 1, 3)
    for token in ("<mask_1>", "<unk_2>", "<unk_102>"):
        assert ours.token_to_id(token) == theirs.convert_tokens_to_ids(token), token
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) + [ours.eos_id] == ids, text
        if ours.unk_id not in ids:  # the libraries space unknown pieces differently when skipping them
            assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert (tmp_path / "back" / "spiece.model").read_bytes() == data
    assert json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())["offset"] == 103
    again = hf_tokenizer(tmp_path / "back")
    assert [again(t)["input_ids"] for t in TEXTS] == [theirs(t)["input_ids"] for t in TEXTS]


def bloom_tokenizer_json() -> bytes:
    """A byte-level BPE trained here with BLOOM's tokenizer.json settings (its split regex, no
    prefix space, ids 0-3 for <unk> <s> </s> <pad>)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(" ?[^(\\s|[.,!?…。，、।۔،])]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(SENTENCES + TEXTS, trainer)
    return tok.to_str().encode("utf-8")


def test_bloom_tokenizer_json_is_used_as_it_is(tmp_path):
    data = bloom_tokenizer_json()
    theirs = run_with_tokenizer(tmp_path, BLOOM, {"tokenizer.json": data}, {
        "tokenizer_class": "TokenizersBackend", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>"})
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    cfg, ours = load_run(tmp_path / "pentad")
    assert cfg.tokenizer.type == "tokenizer_json"
    assert (tmp_path / "pentad" / "tokenizer" / "hf_tokenizer.json").read_bytes() == data
    assert (ours.unk_id, ours.bos_id, ours.eos_id, ours.pad_id) == (0, 1, 2, 3)
    for text in TEXTS:
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids) == text
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == data
    again = hf_tokenizer(tmp_path / "back")
    assert [again(t)["input_ids"] for t in TEXTS] == [theirs(t)["input_ids"] for t in TEXTS]


def qwen2_tokenizer_json() -> bytes:
    """A byte-level BPE trained here with Qwen2's tokenizer.json settings (NFC, its split regex,
    byte-level without its own regex), <|endoftext|> as its one special token."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(SENTENCES + TEXTS, trainer)
    return tok.to_str().encode("utf-8")


def test_qwen2_tokenizer_json_is_used_as_it_is(tmp_path):
    data = qwen2_tokenizer_json()
    theirs = run_with_tokenizer(tmp_path, QWEN2_MOE, {"tokenizer.json": data}, {
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    cfg, ours = load_run(tmp_path / "pentad")
    assert cfg.tokenizer.type == "tokenizer_json"
    assert ours.eos_id == ours.pad_id == theirs.eos_token_id == 0
    for text in TEXTS:
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == data
    again = hf_tokenizer(tmp_path / "back")
    assert type(again).__name__ == type(theirs).__name__
    assert [again(t)["input_ids"] for t in TEXTS] == [theirs(t)["input_ids"] for t in TEXTS]


def test_albert_normalises_like_albert_tokenizer(tmp_path):
    data = train_sentencepiece(model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                               control_symbols=["[CLS]", "[SEP]"], user_defined_symbols=["[MASK]"])
    theirs = run_with_tokenizer(tmp_path, ALBERT, {"spiece.model": data}, {"tokenizer_class": "AlbertTokenizer"})
    report = convert("hf-to-pentad", tmp_path / "hf", tmp_path / "pentad")
    assert not any("normalise" in n for n in report.notes)
    cfg, ours = load_run(tmp_path / "pentad")
    assert (cfg.tokenizer.lowercase, cfg.tokenizer.strip_accents, cfg.tokenizer.replace_quotes) == (True, True, True)
    for text in TEXTS:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    assert (ours.cls_id, ours.sep_id, ours.mask_id) == (theirs.cls_token_id, theirs.sep_token_id,
                                                        theirs.mask_token_id)
    convert("pentad-to-hf", tmp_path / "pentad", tmp_path / "back")
    exported = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert exported["do_lower_case"] is True and exported["keep_accents"] is False
    again = hf_tokenizer(tmp_path / "back")
    assert [again(t)["input_ids"] for t in TEXTS] == [theirs(t)["input_ids"] for t in TEXTS]
    # keep_accents / cased models keep them.
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "AlbertTokenizer", "do_lower_case": False, "keep_accents": True}))
    cased = hf_tokenizer(tmp_path / "hf")
    convert("hf-to-pentad", tmp_path / "hf", tmp_path / "cased")
    _, ours = load_run(tmp_path / "cased")
    for text in TEXTS:
        assert ours.encode(text) == cased(text, add_special_tokens=False)["input_ids"], text
