"""The multi_label task: its TSV format (comma-separated label sets, empty = none), label maps, metrics
against hand-computed values, the sigmoid head's loss and the prediction file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pentad.components.base import Batch
from pentad.components.targets.multi_label import MultiLabelTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.multi_label import MultiLabelTask, MultiLabelTaskConfig, multi_label_metrics, split_labels


@pytest.fixture()
def tok(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "mary", "lives", "in", "paris", "works", "at", "acme"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def task(tok, **cfg):
    return MultiLabelTask(MultiLabelTaskConfig(**cfg), tok, 16)


TRAIN = "label\ttext_a\nPER,LOC\tmary lives in paris\n\tlives in\nORG\tworks at acme\nPER\tmary\n"


def test_metrics_match_hand_computed_values():
    gold = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    pred = np.array([[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=bool)
    m = multi_label_metrics(pred, gold)
    # label 0: tp 2 -> F1 1; label 1: tp 1, fn 1 -> 2/3; label 2: fp 1, fn 1 -> 0; label 3 absent: left out
    assert m["macro_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert m["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))  # tp 3, fp 1, fn 2
    assert m["subset_accuracy"] == pytest.approx(1 / 4)  # only the empty row is exactly right
    nothing = np.zeros((2, 3), dtype=bool)
    assert multi_label_metrics(nothing, nothing) == {"micro_f1": 0.0, "macro_f1": 0.0, "subset_accuracy": 1.0}


def test_label_fields():
    assert split_labels("", "f.tsv", 2) == [] and split_labels(" ", "f.tsv", 2) == []
    assert split_labels("PER, LOC,PER", "f.tsv", 2) == ["PER", "LOC"]
    for bad in ("PER,,LOC", "PER,", ",PER"):
        with pytest.raises(UserError, match=r"f\.tsv, line 7: the label field .* has an empty label"):
            split_labels(bad, "f.tsv", 7)


def test_fit_read_collate_and_state(tok, tmp_path):
    t = task(tok)
    t.fit(write(tmp_path / "train.tsv", TRAIN))
    assert t.label_map.names == ["LOC", "ORG", "PER"] and not t.label_map.integer
    examples = t.read(tmp_path / "train.tsv")
    assert examples.targets.tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert examples.gold.dtype == bool and t.gold(examples).sum() == 4
    batch = t.collate(examples, [0, 2], np.random.default_rng(0))
    assert batch.labels["multi_label"].dtype == torch.float32 and batch.labels["multi_label"].shape == (2, 3)
    assert batch.tokens[0, 0].item() == tok.cls_id
    again = MultiLabelTask(MultiLabelTaskConfig(), tok, 16, state=t.state())
    assert again.label_map == t.label_map
    assert t.head_configs() == [{"type": "multi_label", "num_labels": 3, "pooling": "first", "dropout": 0.1}]
    unlabelled = t.read(write(tmp_path / "in.tsv", "text_a\nmary\n"), with_labels=False)
    assert unlabelled.targets is None and len(unlabelled) == 1
    with pytest.raises(UserError, match="no labels"):
        t.gold(unlabelled)


def test_integer_labels_follow_tencentpretrain(tok, tmp_path):
    t = task(tok)
    t.fit(write(tmp_path / "train.tsv", "label\ttext_a\n0,2\tmary\n1\tparis\n\tacme\n"))
    assert t.label_map.integer and t.num_labels == 3
    with pytest.raises(UserError, match=r"train2\.tsv.*id 1 never occurs.*label 2 \(line 2\)"):
        task(tok).fit(write(tmp_path / "train2.tsv", "label\ttext_a\n0,2\tmary\n0\tparis\n"))
    wide = task(tok, num_labels=4)
    wide.fit(tmp_path / "train2.tsv")
    assert wide.num_labels == 4


def test_bad_input_names_file_and_line(tok, tmp_path):
    with pytest.raises(UserError, match=r"none\.tsv: no example has a label"):
        task(tok).fit(write(tmp_path / "none.tsv", "label\ttext_a\n\tmary\n\tparis\n"))
    with pytest.raises(UserError, match=r"bad\.tsv, line 3: the label field 'PER,,LOC'"):
        task(tok).fit(write(tmp_path / "bad.tsv", "label\ttext_a\nPER\tmary\nPER,,LOC\tparis\n"))
    t = task(tok)
    t.fit(write(tmp_path / "train.tsv", TRAIN))
    with pytest.raises(UserError, match=r"dev\.tsv, line 3: label 'MISC' is unknown"):
        t.read(write(tmp_path / "dev.tsv", "label\ttext_a\nPER\tmary\nPER,MISC\tparis\n"))
    with pytest.raises(UserError, match=r"cols\.tsv, line 2: the line has 1 tab-separated field"):
        t.read(write(tmp_path / "cols.tsv", "label\ttext_a\nmary\n"))
    with pytest.raises(UserError, match=r"head\.tsv, line 1: expected a header line 'label<TAB>text_a"):
        t.read(write(tmp_path / "head.tsv", "labels\ttext_a\nPER\tmary\n"))


def test_head_loss_is_binary_cross_entropy():
    torch.manual_seed(0)
    head = MultiLabelTarget("multi_label", 8, 3, dropout=0.0)
    hidden = torch.randn(4, 5, 8)
    labels = torch.tensor([[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]], dtype=torch.float32)
    batch = Batch(tokens=torch.zeros(4, 5, dtype=torch.long), padding_mask=torch.zeros(4, 5, dtype=torch.bool),
                  labels={"multi_label": labels})
    out = head(hidden, batch)
    assert out.logits.shape == (4, 3)
    expected = F.binary_cross_entropy(torch.sigmoid(out.logits), labels)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.metrics["count"].item() == 4
    assert out.metrics["correct"].item() == int(((out.logits > 0) == labels.bool()).all(-1).sum())


def test_predictions_file_uses_the_threshold(tok, tmp_path):
    t = task(tok, threshold=0.7)
    t.fit(write(tmp_path / "train.tsv", TRAIN))
    examples = t.read(tmp_path / "train.tsv")
    probs = torch.tensor([[0.9, 0.6, 0.8], [0.1, 0.2, 0.3], [0.71, 0.69, 0.0], [0.5, 0.5, 0.99]])
    logits = torch.log(probs / (1 - probs))
    t.write_predictions(tmp_path / "pred.tsv", logits, examples, probabilities=False)
    assert (tmp_path / "pred.tsv").read_text().splitlines() == ["label", "LOC,PER", "", "LOC", "PER"]
    t.write_predictions(tmp_path / "prob.tsv", logits, examples, probabilities=True)
    lines = (tmp_path / "prob.tsv").read_text().splitlines()
    assert lines[0] == "label\tprob_LOC\tprob_ORG\tprob_PER" and lines[1] == "LOC,PER\t0.900000\t0.600000\t0.800000"
    assert t.score(logits, examples, examples.gold)["subset_accuracy"] == pytest.approx(3 / 4)  # row 2 wrong
