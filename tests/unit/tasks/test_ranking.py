"""The ranking task (DBQA): MRR and MAP against hand-computed values, questions without a correct candidate,
the TSV format with its qid column, bad input, and the prediction file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pentad.data.tokenizers import load_tokenizer
from pentad.errors import UserError
from pentad.tasks.ranking import RankingTask, RankingTaskConfig, question_groups, ranking_metrics, unanswered


@pytest.fixture()
def tok(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "where", "is", "mary", "paris", "she", "lives"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return load_tokenizer({"type": "wordpiece", "vocab": str(tmp_path / "vocab.txt"), "lowercase": True})


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def task(tok, **cfg):
    return RankingTask(RankingTaskConfig(**cfg), tok, 16)


TRAIN = ("label\tqid\ttext_a\ttext_b\n"
         "0\t1\twho is she\tparis is\n1\t1\twho is she\tshe is mary\n"
         "1\t2\twhere\tshe lives paris\n0\t2\twhere\tmary\n0\t2\twhere\tis\n")

QIDS = ["a"] * 3 + ["b"] * 4 + ["c"] * 2
SCORES = np.array([0.9, 0.5, 0.7, 0.2, 0.8, 0.6, 0.1, 0.3, 0.4])
LABELS = np.array([0, 1, 0, 1, 0, 1, 0, 0, 0])


def test_mrr_and_map_match_hand_computed_values():
    # a: the correct candidate ranks 3rd -> RR 1/3, AP 1/3; b: correct ones rank 2nd and 3rd -> RR 1/2,
    # AP (1/2 + 2/3) / 2 = 7/12; c has no correct candidate: skipped
    m = ranking_metrics(SCORES, LABELS, QIDS)
    assert m["mrr"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert m["map"] == pytest.approx((1 / 3 + 7 / 12) / 2)
    assert unanswered(LABELS, QIDS) == 1
    # reversed scores: a's correct candidate ranks 1st; b's rank 2nd and 3rd again (behind the 0.1 candidate)
    assert ranking_metrics(-SCORES, LABELS, QIDS) == {"mrr": pytest.approx((1 + 1 / 2) / 2),
                                                      "map": pytest.approx((1 + 7 / 12) / 2)}
    assert ranking_metrics(np.zeros(3), np.zeros(3), ["q"] * 3) == {"mrr": 0.0, "map": 0.0}


def test_ties_rank_in_file_order_and_groups_follow_first_appearance():
    assert ranking_metrics(np.array([0.5, 0.5]), np.array([0, 1]), ["q", "q"])["mrr"] == 0.5
    assert ranking_metrics(np.array([0.5, 0.5]), np.array([1, 0]), ["q", "q"])["mrr"] == 1.0
    assert [g.tolist() for g in question_groups(["x", "y", "y", "z"])] == [[0], [1, 2], [3]]


def test_read_fit_and_collate(tok, tmp_path):
    t = task(tok)
    t.fit(write(tmp_path / "train.tsv", TRAIN))
    examples = t.read(tmp_path / "train.tsv")
    assert examples.groups == ["1", "1", "2", "2", "2"] and t.gold(examples).tolist() == [0, 1, 1, 0, 0]
    batch = t.collate(examples, [1, 3], np.random.default_rng(0))
    assert batch.labels["cls"].tolist() == [1, 0]
    assert batch.segments[0].max().item() == 1  # question and candidate are segments 0 and 1
    assert t.head_configs() == [{"type": "cls", "num_labels": 2, "pooling": "first", "dropout": 0.1}]
    # columns in any order; an inference file has no label column
    shuffled = t.read(write(tmp_path / "s.tsv", "text_b\tqid\tlabel\ttext_a\nmary\tq7\t1\twho\n"))
    assert shuffled.groups == ["q7"] and shuffled.gold.tolist() == [1]
    unlabelled = t.read(write(tmp_path / "in.tsv", "qid\ttext_a\ttext_b\n1\twho\tmary\n1\twho\tparis\n"),
                        with_labels=False)
    assert unlabelled.gold is None and unlabelled.groups == ["1", "1"]
    with pytest.raises(UserError, match="no labels"):
        t.gold(unlabelled)


def test_bad_input_names_file_and_line(tok, tmp_path):
    t = task(tok)
    with pytest.raises(UserError, match=r"apart\.tsv, line 4: qid '1' appeared before \(line 2\)"):
        t.read(write(tmp_path / "apart.tsv", "label\tqid\ttext_a\ttext_b\n1\t1\tw\tm\n0\t2\tw\tm\n0\t1\tw\tp\n"))
    with pytest.raises(UserError, match=r"label\.tsv, line 3: label '2' is unknown"):
        t.read(write(tmp_path / "label.tsv", "label\tqid\ttext_a\ttext_b\n1\t1\tw\tm\n2\t1\tw\tp\n"))
    with pytest.raises(UserError, match=r"noqid\.tsv, line 1: expected a header line "
                                        r"'label<TAB>qid<TAB>text_a<TAB>text_b'.*no 'qid' column"):
        t.read(write(tmp_path / "noqid.tsv", "label\ttext_a\ttext_b\n1\tw\tm\n"))
    with pytest.raises(UserError, match=r"emptyq\.tsv, line 2: the line has an empty qid field"):
        t.read(write(tmp_path / "emptyq.tsv", "label\tqid\ttext_a\ttext_b\n1\t \tw\tm\n"))
    with pytest.raises(UserError, match=r"neg\.tsv: every candidate is labelled 0"):
        t.fit(write(tmp_path / "neg.tsv", "label\tqid\ttext_a\ttext_b\n0\t1\tw\tm\n0\t1\tw\tp\n"))


def test_predictions_file_ranks_within_each_question(tok, tmp_path):
    t = task(tok)
    examples = t.read(write(tmp_path / "train.tsv", TRAIN))
    scores = np.array([0.2, 0.9, 0.1, 0.7, 0.4])
    t.write_predictions(tmp_path / "pred.tsv", scores, examples, probabilities=False)
    assert (tmp_path / "pred.tsv").read_text().splitlines() == [
        "qid\tscore\trank", "1\t0.200000\t2", "1\t0.900000\t1", "2\t0.100000\t3", "2\t0.700000\t1",
        "2\t0.400000\t2"]
    assert t.score(scores, examples, examples.gold) == {"mrr": pytest.approx(2 / 3), "map": pytest.approx(2 / 3)}


def test_scores_are_the_probability_of_label_one(tok, tmp_path):
    t = task(tok)
    examples = t.read(write(tmp_path / "train.tsv", TRAIN))

    class Fixed(torch.nn.Module):
        def forward(self, batch):
            from pentad.components.base import TargetOutput

            n = batch.tokens.shape[0]
            return {"cls": TargetOutput(loss=None, logits=torch.tensor([[0.0, 1.0]]).expand(n, 2))}

    scores = t.predict(Fixed(), examples, 2, torch.device("cpu"))
    assert scores == pytest.approx([1 / (1 + np.exp(-1.0))] * 5)
