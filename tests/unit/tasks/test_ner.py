"""The ner task: reading tagging TSVs, aligning tags to word pieces, conlleval chunking and metrics,
and the tagger head's loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.components.targets.tagger import TaggerTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.data.tsv import LabelMap
from pentad.errors import UserError
from pentad.tasks.ner import (
    NerTask,
    NerTaskConfig,
    chunks,
    collate_tagged,
    encode_tagged,
    read_tagging_tsv,
    tag_order,
    tagging_metrics,
)


@pytest.fixture()
def wordpiece(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "new", "york", "play", "##ing",
              "##ed", "mary"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("tags, spans", [
    (["B-PER", "I-PER", "O", "B-LOC"], {(0, 2, "PER"), (3, 4, "LOC")}),
    (["I-PER", "I-PER", "B-PER", "O"], {(0, 2, "PER"), (2, 3, "PER")}),          # IOB1
    (["S-LOC", "B-ORG", "I-ORG", "E-ORG", "O"], {(0, 1, "LOC"), (1, 4, "ORG")}),  # BIOES
    (["U-LOC", "B-ORG", "L-ORG"], {(0, 1, "LOC"), (1, 3, "ORG")}),                # BILOU
    (["O", "I-PER", "I-LOC"], {(1, 2, "PER"), (2, 3, "LOC")}),                    # a type change ends a chunk
    (["B-PER", "E-PER", "E-PER"], {(0, 2, "PER"), (2, 3, "PER")}),                # E after E starts one
    (["B-PER", "B-PER"], {(0, 1, "PER"), (1, 2, "PER")}),
    (["O", "O"], set()),
])
def test_chunks_follow_conlleval(tags, spans):
    assert chunks(tags) == spans


def test_metrics_are_entity_level_and_exact():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-LOC"]]   # PER right, LOC missed, ORG right, LOC spurious
    m = tagging_metrics(gold, pred)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3) and m["accuracy"] == pytest.approx(4 / 6)
    # A partly right span (wrong end) counts as wrong.
    assert tagging_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    assert "f1" not in tagging_metrics([["NN", "VB"]], [["NN", "NN"]], entity_level=False)


def test_tags_align_to_first_pieces_and_truncation_is_counted(wordpiece, tmp_path):
    path = write(tmp_path / "t.tsv", "text_a\tlabel\nmary playing new york\tB-PER O B-LOC I-LOC\n"
                                     "the cat played\tO O O\n")
    rows = read_tagging_tsv(path, with_labels=True)
    labels = LabelMap(tag_order([t for r in rows for t in r.tags]), integer=False)
    assert labels.names == ["O", "B-LOC", "B-PER", "I-LOC"]
    seqs = encode_tagged(rows, wordpiece, seq_length=16, label_map=labels, path=path)
    ids = [wordpiece.token_to_id(t) for t in ["[CLS]", "mary", "play", "##ing", "new", "york", "[SEP]"]]
    assert seqs.tokens[0].tolist() == ids
    assert seqs.targets[0].tolist() == [IGNORE_INDEX, 2, 0, IGNORE_INDEX, 1, 3, IGNORE_INDEX]
    assert seqs.starts[0].tolist() == [1, 2, 4, 5] and seqs.truncated_words == 0
    short = encode_tagged(rows, wordpiece, seq_length=5, label_map=labels, path=path)
    # [CLS] mary play ##ing [SEP]: the 3-piece budget keeps 'mary' and 'playing', drops 'new york'.
    assert short.tokens[0].tolist() == ids[:4] + ids[-1:] and short.starts[0].tolist() == [1, 2]
    assert short.truncated_words == 2
    batch = collate_tagged(seqs, [1, 0], wordpiece.pad_id, "tagger")
    # Row 0 is 'the cat played': [CLS] the cat play ##ed [SEP], one padding position.
    assert batch.tokens.shape == (2, 7) and batch.padding_mask[0].tolist() == [False] * 6 + [True]
    assert batch.labels["tagger"][0].tolist() == [IGNORE_INDEX, 0, 0, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_byte_level_bpe_words_get_a_leading_space(tmp_path):
    from tests.unit.interop.helpers import write_bpe

    tok = load_tokenizer(write_bpe(tmp_path / "bpe", roberta=True))
    rows = read_tagging_tsv(write(tmp_path / "t.tsv", "text_a\nab ab\n"), with_labels=False)
    seqs = encode_tagged(rows, tok, seq_length=16, label_map=None)
    word = tok.encode(" ab")
    assert seqs.tokens[0].tolist() == [tok.cls_id, *word, *word, tok.sep_id]
    assert (seqs.targets[0] == IGNORE_INDEX).all()


@pytest.mark.parametrize("text, message", [
    ("words\tlabel\na b\tO O\n", r"line 1: expected a header line"),
    ("text_a\tlabel\na b\tO\n", r"line 2: 2 word\(s\) but 1 tag\(s\)"),
    ("text_a\tlabel\na  b\tO O O\n", r"line 2: word 2 is empty"),
    ("text_a\ttext_b\tlabel\na\tb\tO\n", r"line 1: a tagging file has the columns"),
])
def test_bad_files_name_the_line(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        read_tagging_tsv(write(tmp_path / "bad.tsv", text), with_labels=True)


def test_tag_sets(wordpiece, tmp_path):
    train = write(tmp_path / "train.tsv", "text_a\tlabel\nthe cat\tB-X O\nmary sat\tB-PER O\n")
    task = NerTask(NerTaskConfig(labels_file=write(tmp_path / "l.json", json.dumps({"O": 0, "B-PER": 1, "B-X": 2}))),
                   wordpiece, 16)
    task.fit(train)
    assert task.label_map.names == ["O", "B-PER", "B-X"]
    task = NerTask(NerTaskConfig(labels=["O", "B-PER"]), wordpiece, 16)
    with pytest.raises(UserError, match=r"tag\(s\) \['B-X'\] are not in the configured tag set"):
        task.fit(train)
    pos = write(tmp_path / "pos.tsv", "text_a\tlabel\nthe cat\tDT NN\n")
    with pytest.raises(UserError, match="use task.metric=accuracy"):
        NerTask(NerTaskConfig(), wordpiece, 16).fit(pos)
    task = NerTask(NerTaskConfig(metric="accuracy"), wordpiece, 16)
    task.fit(pos)
    assert not task.entity_level
    dev = write(tmp_path / "dev.tsv", "text_a\tlabel\nthe cat\tDT JJ\n")
    with pytest.raises(UserError, match=r"dev.tsv, line 2: label 'JJ' is unknown"):
        task.read(dev)
    with pytest.raises(UserError, match="ids must be 0..1"):
        NerTask(NerTaskConfig(labels_file=write(tmp_path / "m.json", '{"O": 0, "B": 2}')), wordpiece, 16)


def test_tagger_loss_scores_only_labelled_positions():
    torch.manual_seed(0)
    head = TaggerTarget("tagger", hidden_size=8, num_labels=3, dropout=0.0)
    hidden = torch.randn(2, 4, 8, requires_grad=True)
    labels = torch.tensor([[IGNORE_INDEX, 1, 2, IGNORE_INDEX], [IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX]])
    out = head(hidden, Batch(labels={"tagger": labels}))
    keep = labels != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(out.logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)
    assert int(out.metrics["count"]) == 3
    out.loss.backward()
    assert hidden.grad[~keep].abs().sum() == 0 and hidden.grad[keep].abs().sum() > 0
    nothing = head(hidden, Batch(labels={"tagger": torch.full((2, 4), IGNORE_INDEX)}))
    assert nothing.loss.item() == 0.0 and not np.isnan(nothing.loss.item())
