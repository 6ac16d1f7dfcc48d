"""Objectives: instances built from real corpus lines, and their collated batches."""

from __future__ import annotations

import numpy as np
import pytest

from pentad.components.base import IGNORE_INDEX
from pentad.data.corpus import BadLine
from pentad.data.objectives import BertObjective, ClsObjective, LmObjective, MlmObjective
from pentad.data.objectives.base import windows
from pentad.data.tokenizers import load_tokenizer
from pentad.data.tsv import read_classification_tsv
from pentad.registry import OBJECTIVES


@pytest.fixture(scope="module")
def tok(shared_data):
    return load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")})


def read_lines(path, count):
    with open(path, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(count)]


@pytest.fixture(scope="module")
def sentences(shared_data):
    lines = read_lines(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", 2000)
    return [line if line.strip() else None for line in lines]


@pytest.fixture(scope="module")
def documents(shared_data):
    return read_lines(shared_data / "corpora/CLUECorpusSmall_sampled.txt", 60)


def test_registered():
    assert {"bert", "mlm", "lm", "cls"} <= set(OBJECTIVES.names())
    for name in ("bert", "mlm", "lm", "cls"):
        cfg = OBJECTIVES.config_class(name)()
        assert cfg.type == name and cfg.seq_length == 128


def test_bert_instances_and_nsp_balance(tok, sentences):
    obj = BertObjective(BertObjective.Config(seq_length=64), tok)
    inst = obj.build(sentences, np.random.default_rng(0))
    assert len(inst) > 500
    assert (inst.lengths <= 64).all()
    for i in range(0, len(inst), 7):
        seq, split = inst.sequence(i), inst.fields["split"][i]
        assert seq[0] == tok.cls_id and seq[split - 1] == tok.sep_id and seq[-1] == tok.sep_id
        assert 2 <= split < len(seq) - 1  # both segments non-empty
        assert (seq[1:split - 1] != tok.sep_id).all()
    assert abs(inst.fields["sp"].mean() - 0.5) < 0.05
    short = (inst.lengths < 40).mean()
    assert 0.02 < short < 0.5  # short_seq_prob makes some instances shorter


def test_bert_is_deterministic_per_seed(tok, sentences):
    obj = BertObjective(BertObjective.Config(seq_length=64), tok)
    a = obj.build(sentences[:300], np.random.default_rng(4))
    b = obj.build(sentences[:300], np.random.default_rng(4))
    assert a.tokens.tolist() == b.tokens.tolist() and a.fields["sp"].tolist() == b.fields["sp"].tolist()


def test_bert_collate(tok, sentences):
    obj = BertObjective(BertObjective.Config(seq_length=64), tok)
    inst = obj.build(sentences[:300], np.random.default_rng(0))[:16]
    batch = obj.collate(inst, np.random.default_rng(0))
    width = int(inst.lengths.max())
    assert batch.tokens.shape == batch.segments.shape == batch.padding_mask.shape == (16, width)
    assert batch.labels["mlm"].shape == (16, width) and batch.labels["sp"].shape == (16,)
    assert batch.provided() == set(obj.provides)
    assert (~batch.padding_mask).sum(1).tolist() == inst.lengths.tolist()
    split = inst.fields["split"]
    for b in range(16):
        seg = batch.segments[b].numpy()
        assert (seg[:split[b]] == 0).all() and (seg[split[b]:inst.lengths[b]] == 1).all()
        assert (seg[inst.lengths[b]:] == 0).all()
    assert (batch.labels["mlm"][batch.padding_mask] == IGNORE_INDEX).all()
    assert ((batch.labels["mlm"] != IGNORE_INDEX).sum(1) >= 1).all()


def test_mlm_pieces(tok, documents):
    obj = MlmObjective(MlmObjective.Config(seq_length=32), tok)
    inst = obj.build(documents, np.random.default_rng(0))
    assert (inst.lengths <= 32).all() and (inst.lengths >= 3).all()
    ids, valid = inst.padded(0)
    assert (ids[:, 0] == tok.cls_id).all()
    assert (ids[np.arange(len(inst)), inst.lengths - 1] == tok.sep_id).all()
    inner = np.concatenate([inst.sequence(i)[1:-1] for i in range(len(inst))])
    expected = np.concatenate([np.asarray(d) for d in tok.encode_batch(documents)])
    assert inner.tolist() == expected.tolist()  # nothing lost, nothing reordered


def test_mlm_pack_stream_and_windows(tok, documents):
    obj = MlmObjective(MlmObjective.Config(seq_length=32, pack=True), tok)
    assert obj.packs and obj.window == (32, 32)
    stream = obj.build(documents, np.random.default_rng(0))
    assert stream[0] == tok.cls_id and stream[-1] == tok.sep_id
    inst, rest = windows(stream, 32, 32, final=False)
    assert (inst.lengths == 32).all() and len(rest) < 32
    last, _ = windows(rest, 32, 32, final=True)
    assert np.concatenate([inst.tokens, last.tokens]).tolist() == stream.tolist()
    batch = obj.collate(inst[:8], np.random.default_rng(0))
    assert batch.tokens.shape == (8, 32) and batch.provided() == set(obj.provides)
    assert (batch.segments == 0).all()


def test_lm_labels_are_shifted_tokens(tok, documents):
    obj = LmObjective(LmObjective.Config(seq_length=32), tok)
    stream = obj.build(documents, np.random.default_rng(0))
    assert stream[0] == tok.cls_id and stream[-1] == tok.sep_id  # [CLS] doc [SEP] as TencentPretrain
    inst, rest = windows(stream, 33, 32, final=False)
    last, _ = windows(rest, 33, 32, final=True)
    inst = type(inst).concat([inst, last])
    # Windows overlap by one token, so every token after the first is predicted exactly once.
    predicted = np.concatenate([inst.sequence(i)[1:] for i in range(len(inst))])
    assert predicted.tolist() == stream[1:].tolist()
    batch = obj.collate(inst[-4:], np.random.default_rng(0))
    assert batch.tokens.shape == batch.labels["lm"].shape == (4, 32)
    assert batch.provided() == set(obj.provides)
    ids, valid = inst[-4:].padded(0)
    scored = ~batch.padding_mask.numpy()
    assert (batch.labels["lm"].numpy()[scored] == ids[:, 1:][scored]).all()
    assert (batch.tokens.numpy()[scored] == ids[:, :-1][scored]).all()
    assert (batch.labels["lm"].numpy()[~scored] == IGNORE_INDEX).all()
    assert scored.sum(1).tolist() == (inst[-4:].lengths - 1).tolist()


def test_lm_without_pack_windows_each_document(tok, documents):
    obj = LmObjective(LmObjective.Config(seq_length=32, pack=False), tok)
    inst = obj.build(documents[:5], np.random.default_rng(0))
    assert (inst.lengths <= 33).all()
    starts = [inst.sequence(i)[0] for i in range(len(inst))]
    assert starts.count(tok.cls_id) == 5


def test_lm_jsonl_format(tok, tmp_path):
    obj = LmObjective(LmObjective.Config(), tok)
    assert obj.begin_corpus('{"text": "你好"}', tmp_path / "c.txt") == ("jsonl", False)
    assert obj.begin_corpus("plain text", tmp_path / "c.txt") == ("text", False)
    assert obj.begin_corpus("plain text", tmp_path / "c.jsonl") == ("jsonl", False)
    assert obj.parse_line('{"text": "abc", "id": 1}', "jsonl") == "abc"
    with pytest.raises(BadLine, match="not valid JSON"):
        obj.parse_line('{"text": ', "jsonl")
    with pytest.raises(BadLine, match='"text"'):
        obj.parse_line('{"body": "x"}', "jsonl")


def test_cls_objective(tok, shared_data):
    rows, columns = read_classification_tsv(shared_data / "datasets/test_data/book_review/dev.tsv", True)
    obj = ClsObjective(ClsObjective.Config(seq_length=48), tok)
    context, consumed = obj.begin_corpus("\t".join(columns), shared_data / "x.tsv")
    assert consumed and context == ("label", "text_a")
    inst = obj.build(rows[:10], np.random.default_rng(0))
    assert inst.labels == [r.label for r in rows[:10]]
    inst.fields["label"] = np.array([int(x) for x in inst.labels])
    batch = obj.collate(inst, np.random.default_rng(0))
    assert batch.labels["cls"].tolist() == [int(r.label) for r in rows[:10]]
    assert batch.tokens.shape[1] <= 48 and batch.provided() == set(obj.provides)
    del inst.fields["label"]
    assert "cls" not in obj.collate(inst, np.random.default_rng(0)).labels


def test_windows_edge_cases():
    stream = np.arange(10)
    inst, rest = windows(stream, 4, 4, final=True)
    assert inst.lengths.tolist() == [4, 4, 2] and len(rest) == 0
    inst, rest = windows(stream, 5, 4, final=False)  # overlapping (lm) windows
    assert inst.lengths.tolist() == [5, 5] and rest.tolist() == [8, 9]
    inst, rest = windows(np.arange(9), 5, 4, final=True)
    assert inst.lengths.tolist() == [5, 5] and len(rest) == 1  # the last token was already a label
