"""preprocess: corpus -> shards; determinism across workers, atomic output, corpus errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pentad.data.corpus import decode_line
from pentad.data.objectives import BertObjective, ClsObjective, LmObjective, MlmObjective
from pentad.data.preprocess import preprocess
from pentad.data.shards import ShardDataset
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError


@pytest.fixture(scope="module")
def tok_config(shared_data):
    return {"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")}


@pytest.fixture(scope="module")
def tok(tok_config):
    return load_tokenizer(tok_config)


def slice_of(src, dst, lines):
    with open(src, "rb") as f:
        dst.write_bytes(b"".join(next(f) for _ in range(lines)))
    return dst


@pytest.fixture
def bert_corpus(shared_data, tmp_path):
    return slice_of(shared_data / "corpora/CLUECorpusSmall_bert_sampled.txt", tmp_path / "bert.txt", 400)


@pytest.fixture
def doc_corpus(shared_data, tmp_path):
    return slice_of(shared_data / "corpora/CLUECorpusSmall_sampled.txt", tmp_path / "docs.txt", 60)


def run(objective, tok, tok_config, corpus, output, **kw):
    kw.setdefault("progress", False)
    return preprocess(objective, tok, tok_config, corpus, output, **kw)


def test_manifest_and_instances(tok, tok_config, bert_corpus, tmp_path):
    obj = BertObjective(BertObjective.Config(seq_length=64), tok)
    manifest = run(obj, tok, tok_config, bert_corpus, tmp_path / "ds", seed=3)
    on_disk = json.loads((tmp_path / "ds/manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["objective"]["name"] == "bert" and manifest["seq_length"] == 64
    assert manifest["objective"]["config"]["short_seq_prob"] == 0.1
    assert manifest["tokenizer"]["fingerprint"] == tok.fingerprint()
    assert manifest["tokenizer"]["config"]["vocab"] == tok_config["vocab"]
    assert manifest["token_dtype"] == "<u2" and set(manifest["fields"]) == {"split", "sp"}
    assert manifest["corpus"]["size"] == bert_corpus.stat().st_size
    assert manifest["skipped_lines"]["count"] == 0 and manifest["created"]
    # One chunk: the stored instances are exactly what the objective builds from the whole file.
    lines = [decode_line(raw, 2) for raw in bert_corpus.read_bytes().splitlines(keepends=True)]
    want = obj.build([obj.parse_line(x, None) for x in lines], np.random.default_rng([3, 0]))
    got = ShardDataset(tmp_path / "ds").take(np.arange(manifest["num_instances"]))
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.fields["sp"].tolist() == want.fields["sp"].tolist()
    assert manifest["num_tokens"] == len(want.tokens)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ds.")]  # no temp dir left


def dataset_bytes(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "manifest.json"}


def test_workers_do_not_change_the_output(tok, tok_config, bert_corpus, doc_corpus, tmp_path):
    bert = BertObjective(BertObjective.Config(seq_length=64), tok)
    mlm = MlmObjective(MlmObjective.Config(seq_length=64, pack=True), tok)
    for name, obj, corpus in (("bert", bert, bert_corpus), ("mlm", mlm, doc_corpus)):
        one = run(obj, tok, tok_config, corpus, tmp_path / f"{name}1", workers=1, chunk_bytes=8000,
                  max_shard_tokens=5000)
        two = run(obj, tok, tok_config, corpus, tmp_path / f"{name}2", workers=2, chunk_bytes=8000,
                  max_shard_tokens=5000)
        assert len(one["shards"]) > 1
        assert dataset_bytes(tmp_path / f"{name}1") == dataset_bytes(tmp_path / f"{name}2")
        assert {k: v for k, v in one.items() if k != "created"} == {k: v for k, v in two.items() if k != "created"}


def test_packing_ignores_chunk_boundaries(tok, tok_config, doc_corpus, tmp_path):
    obj = LmObjective(LmObjective.Config(seq_length=32), tok)
    run(obj, tok, tok_config, doc_corpus, tmp_path / "a", chunk_bytes=3000)
    run(obj, tok, tok_config, doc_corpus, tmp_path / "b", chunk_bytes=1 << 20)
    assert dataset_bytes(tmp_path / "a") == dataset_bytes(tmp_path / "b")
    lengths = ShardDataset(tmp_path / "a").take(np.arange(len(ShardDataset(tmp_path / "a")))).lengths
    assert (lengths[:-1] == 33).all()  # only the corpus's last window is short


def test_cls_corpus_with_string_labels(tok, tok_config, tmp_path):
    corpus = tmp_path / "cls.tsv"
    corpus.write_text("label\ttext_a\ttext_b\npos\t好\t很好\nneg\t坏\t很坏\nmid\t一般\t还行\npos\t棒\t真棒\n",
                      encoding="utf-8")
    obj = ClsObjective(ClsObjective.Config(seq_length=16), tok)
    manifest = run(obj, tok, tok_config, corpus, tmp_path / "ds", chunk_bytes=20)
    assert manifest["label_map"] == {"kind": "string", "labels": ["mid", "neg", "pos"]}
    inst = ShardDataset(tmp_path / "ds").take([0, 1, 2, 3])
    assert inst.fields["label"].tolist() == [2, 1, 0, 2]
    assert tok.decode(inst.sequence(0)) == "[CLS] 好 [SEP] 很 好 [SEP]"


def test_missing_and_empty_corpus(tok, tok_config, tmp_path):
    obj = MlmObjective(MlmObjective.Config(), tok)
    with pytest.raises(UserError, match=r"absent\.txt does not exist"):
        run(obj, tok, tok_config, tmp_path / "absent.txt", tmp_path / "ds")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.txt is empty"):
        run(obj, tok, tok_config, tmp_path / "empty.txt", tmp_path / "ds")
    (tmp_path / "blank.txt").write_bytes(b"\n  \n\n")
    with pytest.raises(UserError, match=r"blank\.txt produced no instances.*one document per line"):
        run(obj, tok, tok_config, tmp_path / "blank.txt", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_non_utf8_line_fails_or_is_skipped(tok, tok_config, tmp_path, capsys):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes("第一行文本\n第二行\n".encode() + b"\xff\xfe broken\n" + "第四行\n".encode())
    obj = MlmObjective(MlmObjective.Config(), tok)
    with pytest.raises(UserError, match=r"bad\.txt, line 3: the line is not valid UTF-8.*on_bad_line=skip"):
        run(obj, tok, tok_config, corpus, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    manifest = run(obj, tok, tok_config, corpus, tmp_path / "ds", on_bad_line="skip")
    assert manifest["skipped_lines"]["count"] == 1
    assert manifest["skipped_lines"]["examples"][0]["line"] == 3
    assert manifest["num_instances"] == 3
    assert "skipped 1 bad line" in capsys.readouterr().err


def test_cls_format_errors(tok, tok_config, tmp_path):
    obj = ClsObjective(ClsObjective.Config(), tok)
    no_header = tmp_path / "noheader.tsv"
    no_header.write_text("1\t好\n0\t坏\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"noheader\.tsv, line 1: expected a header line"):
        run(obj, tok, tok_config, no_header, tmp_path / "ds")
    columns = tmp_path / "columns.tsv"
    columns.write_text("label\ttext_a\n1\t好\n0\t坏\t多余\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"columns\.tsv, line 3: the line has 3 tab-separated field"):
        run(obj, tok, tok_config, columns, tmp_path / "ds")
    manifest = run(obj, tok, tok_config, columns, tmp_path / "ds", on_bad_line="skip")
    assert manifest["num_instances"] == 1 and manifest["skipped_lines"]["count"] == 1


def test_jsonl_bad_line(tok, tok_config, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "你好"}\n{"text": 3}\n', encoding="utf-8")
    obj = LmObjective(LmObjective.Config(), tok)
    with pytest.raises(UserError, match=r"c\.jsonl, line 2: .*\"text\" field"):
        run(obj, tok, tok_config, corpus, tmp_path / "ds")


def test_output_must_be_new_or_empty(tok, tok_config, doc_corpus, tmp_path):
    obj = MlmObjective(MlmObjective.Config(), tok)
    (tmp_path / "full").mkdir()
    (tmp_path / "full/keep.txt").write_text("x")
    with pytest.raises(UserError, match=r"full already exists and is not empty"):
        run(obj, tok, tok_config, doc_corpus, tmp_path / "full")
    assert (tmp_path / "full/keep.txt").read_text() == "x"
    (tmp_path / "empty").mkdir()
    assert run(obj, tok, tok_config, doc_corpus, tmp_path / "empty")["num_instances"] > 0
    with pytest.raises(UserError, match="is a file"):
        run(obj, tok, tok_config, doc_corpus, tmp_path / "full/keep.txt")


def test_data_config_and_objective_union():
    from typing import Annotated, Union

    from pydantic import Field, ValidationError, create_model

    from pentad.data.config import DataConfigBase
    from pentad.registry import OBJECTIVES

    assert DataConfigBase().workers == 1 and DataConfigBase().on_bad_line == "fail"
    with pytest.raises(ValidationError):
        DataConfigBase(workers=0)
    with pytest.raises(ValidationError):
        DataConfigBase(corpus_path="x")
    union = Annotated[Union[tuple(OBJECTIVES.config_class(n) for n in OBJECTIVES.names())],
                      Field(discriminator="type")]
    data_config = create_model("DataConfig", __base__=DataConfigBase, objective=(union, ...))
    cfg = data_config(corpus="c.txt", objective={"type": "mlm", "pack": True})
    assert cfg.objective.pack and cfg.objective.mask_prob == 0.15
    assert data_config(objective={"type": "lm"}).objective.pack  # lm packs by default
    with pytest.raises(ValidationError):
        data_config(objective={"type": "lm", "mask_prob": 0.1})


def test_an_image_list_far_under_a_chunk_of_bytes_still_splits_across_the_workers(tmp_path, monkeypatch):
    """An image corpus is split by lines (objective.chunk_lines), so data.workers is used on a list of
    a few hundred bytes; the output is the same whatever the split."""
    from PIL import Image

    import pentad.data.preprocess as module
    from pentad.data.objectives.vision import VitObjective, VitObjectiveConfig

    rng = np.random.default_rng(0)
    lines = ["label\tpath"]
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        lines.append(f"{i % 2}\t{i}.png")
    corpus = tmp_path / "list.tsv"
    corpus.write_text("\n".join(lines) + "\n")
    used: list[tuple[int, int]] = []
    results = module._results

    def in_process(job, chunks, workers):  # records the split, computes it here (no pool to start)
        chunks = list(chunks)
        used.append((workers, len(chunks)))
        return results(job, chunks, 1)

    monkeypatch.setattr(module, "_results", in_process)
    monkeypatch.setattr(VitObjective, "chunk_lines", 2)
    objective = VitObjective(VitObjectiveConfig(image_size=[8, 8]), None)
    one = run(objective, None, None, corpus, tmp_path / "one", workers=2)
    assert used == [(2, 3)] and one["chunk_lines"] == 2 and one["num_instances"] == 5
    monkeypatch.setattr(VitObjective, "chunk_lines", None)  # by bytes alone: one chunk, done in-process
    run(objective, None, None, corpus, tmp_path / "bytes", workers=2)
    assert used[1] == (1, 1)
    a, b = (ShardDataset(tmp_path / n).take(np.arange(5)).arrays["image"].data for n in ("one", "bytes"))
    np.testing.assert_array_equal(a, b)


def test_image_preprocess_scales_sixteen_bit_images_and_says_it_converted_them(tmp_path, capsys):
    from PIL import Image

    from pentad.data.objectives.vision import VitObjective, VitObjectiveConfig

    deep = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)  # 16-bit gray, mostly above 255
    Image.fromarray(deep).save(tmp_path / "deep.png")
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "rgb.png")
    corpus = tmp_path / "list.tsv"
    corpus.write_text("label\tpath\n0\tdeep.png\n1\trgb.png\n")
    run(VitObjective(VitObjectiveConfig(image_size=[8, 8]), None), None, None, corpus, tmp_path / "out")
    stored = ShardDataset(tmp_path / "out").take(np.arange(1)).arrays["image"].data.reshape(8, 8, 3)
    expected = np.rint(deep * (255 / 65535)).astype(np.uint8)
    assert all(np.array_equal(stored[..., c], expected) for c in range(3))
    err = capsys.readouterr().err
    assert "images converted from I;16 (16-bit samples scaled by 255/65535) to RGB: 1 line(s)" in err, err
