"""Sentence-pair fine-tuning of a dual (SBERT-style) model through ``pentad finetune`` / ``infer``:
text_a and text_b go to separate streams, a one-stream BERT checkpoint initialises the tied
streams, and the model learns which pairs share a label."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tests.integration.conftest import SENTENCES

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

SIZES = ["model.hidden_size=32", "model.max_seq_length=32", "model.encoder.num_layers=2",
         "model.encoder.num_heads=2", "model.encoder.ffn_size=64",
         "data.objective.seq_length=16"]


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def pairs(english, tmp_path_factory):
    """Pairs of the toy sentences, label 1 when both carry the same sentence label (as in the
    classification fixture: sentence i is labelled 1 - i % 2). Dev pairs are unseen pairs of seen
    sentences, so a model must learn each sentence's label to score them."""
    root = tmp_path_factory.mktemp("pairs")
    train, dev = [], []
    for i, a in enumerate(SENTENCES):
        for j, b in enumerate(SENTENCES):
            (dev if (i + 2 * j) % 5 == 0 else train).append((int(i % 2 == j % 2), a, b))
    for name, rows in (("train", train), ("dev", dev)):
        (root / f"{name}.tsv").write_text("label\ttext_a\ttext_b\n" + "".join(f"{y}\t{a}\t{b}\n" for y, a, b in rows),
                                          encoding="utf-8")
    (root / "nolabel.tsv").write_text("text_a\ttext_b\n" + "".join(f"{a}\t{b}\n" for _, a, b in dev), encoding="utf-8")
    return root


def one_stream_bert(vocab, path) -> None:
    """Weights of a one-stream BERT (mlm + sp heads) of the shrunken sbert/base shape."""
    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.data.tokenizers import load_tokenizer
    from pentad.training import checkpoint as ckpt

    size = load_tokenizer({"type": "wordpiece", "vocab": str(vocab)}).vocab_size
    cfg = load_config("bert/base", [f"model.vocab_size={size}", "model.hidden_size=32", "model.max_seq_length=32",
                                    "model.encoder.num_layers=2", "model.encoder.num_heads=2",
                                    "model.encoder.ffn_size=64"])
    torch.manual_seed(0)
    ckpt.save_weights(build_model(cfg.model), path)


def test_sbert_finetunes_on_pairs_from_a_bert_checkpoint(english, pairs, tmp_path):
    bert = tmp_path / "bert.safetensors"
    one_stream_bert(english["vocab"], bert)
    out = tmp_path / "sbert"
    assert run("finetune", "--task", "classification", "--config", "sbert/base", *SIZES,
               "tokenizer.type=wordpiece", f"tokenizer.vocab={english['vocab']}", f"init={bert}",
               f"data.train={pairs / 'train.tsv'}", f"data.dev={pairs / 'dev.tsv'}", f"output={out}",
               "train.epochs=10", "train.batch_size=16", "train.lr=2e-3", "train.log_every=5",
               "train.progress=false") == 0
    losses = [r["loss"] for r in MetricsLog(out / "metrics.jsonl").read() if "loss" in r]
    assert np.mean(losses[-2:]) < 0.8 * np.mean(losses[:2])
    results = json.loads((out / "results.json").read_text())
    assert results["dev"]["accuracy"] >= 0.8  # chance is 0.5 (dev pairs are 40% positive)

    predictions = tmp_path / "pred.tsv"
    assert run("infer", "--task", "classification", "--model", out, f"data.test={pairs / 'nolabel.tsv'}",
               "--output", predictions) == 0
    lines = predictions.read_text().splitlines()
    assert lines[0] == "label" and len(lines) == 21 and set(lines[1:]) <= {"0", "1"}


def test_separate_pairs_become_two_streams(english):
    from pentad.assembly import load_config
    from pentad.data.tokenizers import load_tokenizer
    from pentad.data.tsv import LabelMap, TsvRow
    from pentad.registry import TASKS

    tokenizer = load_tokenizer({"type": "wordpiece", "vocab": str(english["vocab"])})
    cfg = load_config("sbert/base")
    task = TASKS.get("classification")(cfg.task, tokenizer, seq_length=6, state=LabelMap(["0", "1"], True).to_dict())
    assert {"pair.tokens", "pair.padding_mask"} <= task.provides
    assert task.head_configs()[0]["type"] == "pair_cls" and task.head_configs()[0]["name"] == "cls"
    rows = [TsvRow(2, "the film was a delight", "nothing works", "1"), TsvRow(3, "the ending", "a warm comedy", "0")]
    from pentad.tasks.classification import collate_separate_pairs, encode_separate_pairs

    instances = encode_separate_pairs(rows, tokenizer, 6, task.label_map)
    batch = collate_separate_pairs(instances[np.array([1, 0])], pad_id=int(tokenizer.pad_id))
    a = tokenizer.encode_batch(["the ending", "the film was a delight"])
    b = tokenizer.encode_batch(["a warm comedy", "nothing works"])
    cls, sep = int(tokenizer.cls_id), int(tokenizer.sep_id)
    for stream, texts in ((batch, a), (batch.pair, b)):
        for row, ids in enumerate(texts):
            want = [cls, *ids[:4], sep]  # each text truncated to fit seq_length on its own
            real = stream.tokens[row][~stream.padding_mask[row]].tolist()
            assert real == want
        assert int(stream.segments.sum()) == 0
    assert batch.labels["cls"].tolist() == [0, 1]


def test_separate_pairs_need_text_b(english, tmp_path, capsys):
    assert run("finetune", "--task", "classification", "--config", "sbert/base", *SIZES,
               "tokenizer.type=wordpiece", f"tokenizer.vocab={english['vocab']}", f"data.train={english['train']}",
               f"output={tmp_path / 'x'}", "train.progress=false") == 2
    assert f"{english['train']}: pair_input is 'separate'" in capsys.readouterr().err


def test_joint_pairs_on_a_dual_model_name_the_fix(english, pairs, tmp_path, capsys):
    assert run("finetune", "--task", "classification", "--config", "sbert/base", *SIZES, "task.pair_input=joint",
               "tokenizer.type=wordpiece", f"tokenizer.vocab={english['vocab']}", f"data.train={pairs / 'train.tsv'}",
               f"output={tmp_path / 'x'}", "train.progress=false") == 2
    err = capsys.readouterr().err
    assert "model.streams.text_b: no target reads stream 'text_b'" in err and "task.pair_input=separate" in err
