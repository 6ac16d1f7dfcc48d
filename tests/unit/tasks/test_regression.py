"""The regression task: Pearson and Spearman (average ranks for ties) against hand-computed values, label
parsing, standardisation kept in the task state, model selection on mse, the head's loss and the
prediction file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pentad.components.base import Batch
from pentad.components.targets.regression import RegressionTarget
from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.correlation import average_ranks, pearson, spearman
from pentad.tasks.regression import RegressionTask, RegressionTaskConfig, regression_metrics


@pytest.fixture()
def tok(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "very"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def task(tok, **cfg):
    return RegressionTask(RegressionTaskConfig(**cfg), tok, 16)


def test_pearson_and_spearman_match_hand_computed_values():
    # x deviations -1.5 -0.5 0.5 1.5, y deviations -3 -1 0 4: r = 11 / sqrt(5 * 26)
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # y ranks with the tie 7, 7 averaged: 1 2 3.5 5 3.5; r = 8 / sqrt(10 * 9.5) (scipy: 0.8207826816681233)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)  # monotone, not linear
    assert pearson([1, 2, 3, 4], [1, 4, 9, 16]) < 1.0
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0 and spearman([2], [3]) == 0.0  # undefined -> 0


def test_average_ranks():
    assert average_ranks([3, 1, 3]).tolist() == [2.5, 1.0, 2.5]
    assert average_ranks([2, 2, 2, 1]).tolist() == [3.0, 3.0, 3.0, 1.0]
    assert average_ranks([0.5, -1.0, 7.0, 0.5, 0.5]).tolist() == [3.0, 1.0, 5.0, 3.0, 3.0]
    assert average_ranks([]).tolist() == []


def test_metrics_and_selection(tok):
    m = regression_metrics(np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 3.0]))
    assert m["mse"] == pytest.approx((0 + 1 + 1) / 3)
    assert set(m) == {"pearson", "spearman", "mse"}
    assert task(tok, metric="mse").selection_score({"mse": 0.25, "pearson": 0.9}) == -0.25
    assert task(tok).selection_score({"mse": 0.25, "pearson": 0.9}) == 0.9
    # the runner keeps the model with the highest selection score: a lower mse must win
    low, high = {"mse": 0.1}, {"mse": 0.3}
    t = task(tok, metric="mse")
    assert t.selection_score(low) > t.selection_score(high)


def test_standardised_targets_and_state(tok, tmp_path):
    t = task(tok)
    t.fit(write(tmp_path / "train.tsv", "label\ttext_a\n1.0\tgood film\n3\tbad film\n-1e0\tvery good\n"))
    assert t.mean == pytest.approx(1.0) and t.std == pytest.approx(math.sqrt(8 / 3))
    examples = t.read(tmp_path / "train.tsv")
    assert examples.gold.tolist() == [1.0, 3.0, -1.0]
    assert examples.targets.dtype == np.float32
    assert examples.targets == pytest.approx((np.array([1.0, 3.0, -1.0]) - 1.0) / math.sqrt(8 / 3))
    batch = t.collate(examples, [2, 0], np.random.default_rng(0))
    assert batch.labels["regression"].tolist() == pytest.approx(examples.targets[[2, 0]].tolist())
    again = RegressionTask(RegressionTaskConfig(), tok, 16, state=t.state())
    assert (again.mean, again.std) == (t.mean, t.std)
    raw = task(tok, standardize=False)
    raw.fit(tmp_path / "train.tsv")
    assert (raw.mean, raw.std) == (0.0, 1.0) and raw.read(tmp_path / "train.tsv").targets.tolist() == [1, 3, -1]
    with pytest.raises(UserError, match="not a regression task's state"):
        RegressionTask(RegressionTaskConfig(), tok, 16, state={"kind": "integer", "num_labels": 2})


def test_predictions_are_on_the_labels_scale(tok, tmp_path):
    t = task(tok, head_dropout=0.0)
    t.fit(write(tmp_path / "train.tsv", "label\ttext_a\n10\tgood film\n30\tbad film\n"))

    class Constant(torch.nn.Module):  # a model whose head outputs 1.0 (one std above the mean) for every row
        def forward(self, batch):
            from pentad.components.base import TargetOutput

            return {"regression": TargetOutput(loss=None, logits=torch.ones(batch.tokens.shape[0], 1))}

    examples = t.read(write(tmp_path / "in.tsv", "text_a\ngood\nbad\nvery\n"), with_labels=False)
    predicted = t.predict(Constant(), examples, 2, torch.device("cpu"))
    assert predicted.tolist() == [30.0, 30.0, 30.0]  # mean 20 + std 10
    t.write_predictions(tmp_path / "pred.tsv", np.array([30.0, 12.5, -0.125]), examples, probabilities=True)
    assert (tmp_path / "pred.tsv").read_text().splitlines() == ["label", "30", "12.5", "-0.125"]


def test_bad_input_names_file_and_line(tok, tmp_path):
    for label, what in (("good", "is not a number"), ("nan", "is not a finite"), ("-inf", "is not a finite")):
        with pytest.raises(UserError, match=rf"bad\.tsv, line 3: label '{label}' {what}"):
            task(tok).fit(write(tmp_path / "bad.tsv", f"label\ttext_a\n1.5\tgood\n{label}\tbad\n"))
    with pytest.raises(UserError, match=r"same\.tsv: every training label is 2"):
        task(tok).fit(write(tmp_path / "same.tsv", "label\ttext_a\n2\tgood\n2.0\tbad\n"))
    with pytest.raises(UserError, match=r"empty\.tsv, line 2: the line has an empty label"):
        task(tok).fit(write(tmp_path / "empty.tsv", "label\ttext_a\n\tgood\n"))


def test_head_loss_is_mean_squared_error():
    torch.manual_seed(0)
    head = RegressionTarget("regression", 8, dropout=0.0)
    hidden = torch.randn(3, 4, 8)
    labels = torch.tensor([0.5, -1.0, 2.0])
    batch = Batch(tokens=torch.zeros(3, 4, dtype=torch.long), padding_mask=torch.zeros(3, 4, dtype=torch.bool),
                  labels={"regression": labels})
    out = head(hidden, batch)
    assert out.logits.shape == (3, 1)
    assert out.loss.item() == pytest.approx(F.mse_loss(out.logits[:, 0], labels).item())
    assert head(hidden, Batch(tokens=batch.tokens, padding_mask=batch.padding_mask)).loss is None
