"""Classification TSV reading, label maps and encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pentad.data.objectives import ClsObjective
from pentad.data.tokenizers import load_tokenizer
from pentad.data.tsv import LabelMap, TsvRow, encode_classification, fit_pair, read_classification_tsv
from pentad.errors import UserError


@pytest.fixture(scope="module")
def book_review(shared_data):
    return shared_data / "datasets/test_data/book_review"


@pytest.fixture(scope="module")
def tok(shared_data):
    return load_tokenizer({"type": "wordpiece", "vocab": str(shared_data / "models/google_zh_vocab.txt")})


def write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_read_real_files(book_review):
    rows, columns = read_classification_tsv(book_review / "train.tsv", with_labels=True)
    with open(book_review / "train.tsv", encoding="utf-8") as f:
        assert len(rows) == sum(1 for _ in f) - 1
    assert columns == ("label", "text_a")
    assert rows[0].line == 2 and rows[0].label in {"0", "1"} and rows[0].text_b is None
    unlabelled, columns = read_classification_tsv(book_review / "test_nolabel.tsv", with_labels=False)
    assert columns == ("text_a",) and unlabelled[0].label is None
    with pytest.raises(UserError, match=r"test_nolabel\.tsv, line 1.*no 'label' column"):
        read_classification_tsv(book_review / "test_nolabel.tsv", with_labels=True)


def test_pair_columns_in_any_order(tmp_path):
    path = write(tmp_path / "p.tsv", "text_b\tlabel\ttext_a\nb1\tyes\ta1\n")
    rows, columns = read_classification_tsv(path, True)
    assert rows == [TsvRow(2, "a1", "b1", "yes")]


@pytest.mark.parametrize("content, message", [
    ("0\tgood\n1\tbad\n", r"h\.tsv, line 1: expected a header line"),
    ("label\ttext_a\n0\tgood\n1\tbad\textra\n", r"h\.tsv, line 3: the line has 3 tab-separated field"),
    (b"label\ttext_a\n0\tgood\n1\tb\xffad\n", r"h\.tsv, line 3: the line is not valid UTF-8"),
    ("label\ttext_a\n", r"h\.tsv has a header but no data lines"),
    ("", r"h\.tsv is empty"),
    ("label\tsentence\n0\tx\n", r"unknown column name"),
])
def test_tsv_errors_name_file_and_line(tmp_path, content, message):
    with pytest.raises(UserError, match=message):
        read_classification_tsv(write(tmp_path / "h.tsv", content), with_labels=True)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="nope.tsv does not exist"):
        read_classification_tsv(tmp_path / "nope.tsv", True)


def test_integer_label_map(book_review):
    rows, _ = read_classification_tsv(book_review / "train.tsv", True)
    labels = LabelMap.from_rows(rows, book_review / "train.tsv")
    assert labels.integer and labels.num_labels == 2 and labels.names == ["0", "1"]
    assert LabelMap.from_dict(json.loads(json.dumps(labels.to_dict()))) == labels
    assert labels.encode("1", "dev.tsv", 5) == 1
    with pytest.raises(UserError, match=r"dev\.tsv, line 5: label '2' is unknown.*0\.\.1"):
        labels.encode("2", "dev.tsv", 5)
    assert LabelMap.from_rows(rows, "t.tsv", num_labels=5).num_labels == 5


def test_string_label_map(tmp_path):
    rows = [TsvRow(2, "a", label="pos"), TsvRow(3, "b", label="neg"), TsvRow(4, "c", label="neutral")]
    labels = LabelMap.from_rows(rows, "train.tsv")
    assert not labels.integer and labels.names == ["neg", "neutral", "pos"]
    assert labels.encode("pos", "x", 1) == 2 and labels.decode(0) == "neg"
    assert LabelMap.from_dict(labels.to_dict()) == labels
    with pytest.raises(UserError, match=r"test\.tsv, line 9: label 'happy' is unknown.*'neg', 'neutral', 'pos'"):
        labels.encode("happy", "test.tsv", 9)
    with pytest.raises(UserError, match="more than num_labels=2"):
        LabelMap.from_rows(rows, "train.tsv", num_labels=2)


def test_explicit_num_labels_rejects_larger_ids():
    rows = [TsvRow(2, "a", label="0"), TsvRow(3, "b", label="3")]
    with pytest.raises(UserError, match=r"train\.tsv, line 3: label 3 is out of range for num_labels=3"):
        LabelMap.from_rows(rows, "train.tsv", num_labels=3)
    with pytest.raises(UserError, match="line 2: label -1 is negative"):
        LabelMap.from_rows([TsvRow(2, "a", label="-1")], "train.tsv")


def test_encode_and_collate(tok, book_review):
    rows, _ = read_classification_tsv(book_review / "dev.tsv", True)
    labels = LabelMap.from_rows(rows, book_review / "dev.tsv")
    inst = encode_classification(rows, tok, 64, labels, book_review / "dev.tsv")
    assert len(inst) == len(rows) and (inst.lengths <= 64).all()
    first = inst.sequence(0)
    assert first[0] == tok.cls_id and first[-1] == tok.sep_id
    assert inst.fields["label"].tolist() == [int(r.label) for r in rows]
    batch = ClsObjective(ClsObjective.Config(seq_length=64), tok).collate(inst[:8], np.random.default_rng(0))
    assert batch.labels["cls"].shape == (8,) and batch.tokens.shape[0] == 8
    unlabelled = encode_classification(rows, tok, 64, None)
    assert "label" not in unlabelled.fields


def test_pair_encoding_and_truncation(tok):
    rows = [TsvRow(2, "今天天气很好" * 20, "我们去公园", "1"), TsvRow(3, "短", "也短", "0")]
    inst = encode_classification(rows, tok, 32, LabelMap(["0", "1"], integer=True))
    seq, split = inst.sequence(0), inst.fields["split"][0]
    assert len(seq) == 32 and seq[split - 1] == tok.sep_id
    assert tok.decode(seq[split:-1]).replace(" ", "") == "我们去公园"  # the shorter text is kept whole
    seq = inst.sequence(1)
    assert tok.decode(seq) == "[CLS] 短 [SEP] 也 短 [SEP]"
    seg = ClsObjective(ClsObjective.Config(seq_length=32), tok).collate(inst, np.random.default_rng(0)).segments
    assert seg[1, :3].tolist() == [0, 0, 0] and seg[1, 3:6].tolist() == [1, 1, 1]


def test_fit_pair_matches_token_by_token_trimming():
    for a in range(12):
        for b in range(12):
            for budget in range(0, 14):
                la, lb = a, b
                while la + lb > budget:
                    if la > lb:
                        la -= 1
                    else:
                        lb -= 1
                assert fit_pair(a, b, budget) == (la, lb), (a, b, budget)


def test_integer_labels_with_a_gap_name_the_stray_label_and_its_lines():
    rows = [TsvRow(2, "a", label="0"), TsvRow(3, "b", label="1"), TsvRow(4, "c", label="7"), TsvRow(5, "d", label="0")]
    with pytest.raises(UserError, match=r"train\.tsv: integer labels are class ids.*ids 2, 3, 4, 5, 6 never occur "
                                        r"while label 7 \(line 4\) does.*fix it on its line; .*task\.num_labels=8"):
        LabelMap.from_rows(rows, "train.tsv")
    assert LabelMap.from_rows(rows, "train.tsv", num_labels=8).num_labels == 8  # declared: accepted
    one_based = [TsvRow(2, "a", label="1"), TsvRow(3, "b", label="2"), TsvRow(4, "c", label="3")]
    with pytest.raises(UserError, match=r"id 0 never occurs while labels 1 \(line 2\), 2 \(line 3\), 3 \(line 4\) "
                                        r"do.*shifted to start at 0"):
        LabelMap.from_rows(one_based, "train.tsv")


@pytest.mark.parametrize("content, message", [
    ("label\ttext_a\n0\tgood\n1\t\n", r"line 3: the line has an empty text_a field"),
    ("label\ttext_a\n0\tgood\n1\t   \n", r"line 3: the line has an empty text_a field"),
    ("label\ttext_a\ttext_b\n0\tgood\t\n", r"line 2: the line has an empty text_b field"),
    ("label\ttext_a\n0\tgood\n\tbad\n", r"line 3: the line has an empty label field"),
    ("text_a\ngood\n\n", r"line 3: the line has an empty text_a field"),
])
def test_empty_fields_are_errors_in_every_file(tmp_path, content, message):
    path = write(tmp_path / "e.tsv", content)
    with pytest.raises(UserError, match=message):
        read_classification_tsv(path, with_labels="label" in content.split("\n")[0])
