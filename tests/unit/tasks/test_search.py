"""Cross-validation and grid-search pieces: fold assignment, merging out-of-fold prediction files, the
grid's combinations and ``--grid`` parsing, and each task format's examples written back as folds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pentad.cli.main import grid_option
from pentad.errors import UserError
from pentad.registry import TASKS
from pentad.tasks.search import assign_folds, grid_trials, merge_predictions, resolve_model


def test_folds_partition_the_examples_evenly_and_reproducibly():
    parts = assign_folds(10, 3, seed=7)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    assert [len(p) for p in parts] == [4, 3, 3]
    assert all((np.diff(p) > 0).all() for p in parts)  # each held-out part in file order
    assert all((a == b).all() for a, b in zip(parts, assign_folds(10, 3, seed=7), strict=True))
    assert any((a != b).any() for a, b in zip(parts, assign_folds(10, 3, seed=8), strict=True))


def test_merged_line_predictions_follow_the_training_order(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    a.write_text("label\np\nr\n")
    b.write_text("label\nq\n")
    out = tmp_path / "oof.tsv"
    merge_predictions([(np.array([0, 2]), a), (np.array([1]), b)], out, 3)
    assert out.read_text() == "label\np\nq\nr\n"


def test_merged_predictions_of_grouped_examples_are_joined_fold_after_fold(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "d1-1"}\n{"id": "d1-2"}\n')  # one document held out, two questions
    b.write_text('{"id": "d0-1"}\n')
    out = tmp_path / "oof.jsonl"
    merge_predictions([(np.array([1]), a), (np.array([0]), b)], out, 2)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["d1-1", "d1-2", "d0-1"]


def test_merged_json_predictions_are_one_object(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"q1": "x"}')
    b.write_text('{"q2": "y"}')
    merge_predictions([(np.array([0]), a), (np.array([1]), b)], tmp_path / "oof.json", 2)
    assert json.loads((tmp_path / "oof.json").read_text()) == {"q1": "x", "q2": "y"}


def test_grid_combinations_and_refusals():
    trials = grid_trials({"train.lr": [1e-3, 1e-4], "train.epochs": [1, 2, 3]})
    assert len(trials) == 6 and trials[1] == {"train.lr": 1e-3, "train.epochs": 2}
    with pytest.raises(UserError, match="non-empty list"):
        grid_trials({"train.lr": []})
    with pytest.raises(UserError, match="cannot be searched"):
        grid_trials({"output": ["a", "b"]})


def test_grid_option_reads_numbers_as_numbers():
    assert grid_option(["train.lr=1e-4,3e-5", "train.batch_size=16,32", "task.pooling=mean,first"]) == {
        "train.lr": [1e-4, 3e-5], "train.batch_size": [16, 32], "task.pooling": ["mean", "first"]}
    with pytest.raises(UserError, match="KEY=V1,V2"):
        grid_option(["train.lr"])


def test_infer_on_a_grid_means_its_best_trial(tmp_path):
    (tmp_path / "grid" / "trial-2").mkdir(parents=True)
    (tmp_path / "grid.json").write_text(json.dumps({"best_dir": "grid/trial-2"}))
    assert resolve_model(tmp_path) == tmp_path / "grid" / "trial-2"
    cv = tmp_path / "cv"
    cv.mkdir()
    (cv / "cv.json").write_text(json.dumps({"folds": 3}))
    with pytest.raises(UserError, match="fold-1"):
        resolve_model(cv)


# ---------------------------------------------------------------- each format's examples as fold files
def _roundtrip(task: str, source, tmp_path, pick):
    cls = TASKS.get(task)
    examples = cls.examples(source)
    written = cls.write_examples(source, [examples[i] for i in pick], tmp_path / "fold")
    again = cls.examples(written)
    assert again == [examples[i] for i in pick]
    return examples, written


def test_tsv_examples_are_lines(tmp_path):
    src = tmp_path / "train.tsv"
    src.write_text("label\ttext_a\n1\ta\n\n0\tb\n1\tc\n")
    examples, written = _roundtrip("classification", src, tmp_path, [0, 2])
    assert examples == ["1\ta", "0\tb", "1\tc"] and written.read_text() == "label\ttext_a\n1\ta\n1\tc\n"


def test_ranking_examples_keep_a_questions_candidates_together(tmp_path):
    src = tmp_path / "train.tsv"
    src.write_text("label\tqid\ttext_a\ttext_b\n1\tq1\tw\tx\n0\tq1\tw\ty\n0\tq2\tv\tz\n")
    examples, written = _roundtrip("ranking", src, tmp_path, [0])
    assert len(examples) == 2 and written.read_text().count("\n") == 3


def test_qa_examples_are_paragraphs(tmp_path):
    data = {"version": "1", "data": [
        {"title": "t1", "paragraphs": [
            {"context": "abc", "qas": [{"id": "1", "question": "?", "answers": [{"text": "b", "answer_start": 1}]}]},
            {"context": "def", "qas": [{"id": "2", "question": "?", "answers": [{"text": "e", "answer_start": 1}]}]}]},
        {"title": "t2", "paragraphs": [
            {"context": "ghi", "qas": [{"id": "3", "question": "?", "answers": [{"text": "h", "answer_start": 1}]}]}]}]}
    src = tmp_path / "train.json"
    src.write_text(json.dumps(data))
    examples, written = _roundtrip("qa", src, tmp_path, [1, 2])
    assert len(examples) == 3
    out = json.loads(written.read_text())["data"]
    assert [a["title"] for a in out] == ["t1", "t2"] and out[0]["paragraphs"][0]["context"] == "def"


def test_c3_examples_are_documents(tmp_path):
    docs = [[["s1"], [{"question": "q", "choice": ["a", "b"], "answer": "a"}], "d1"],
            [["s2"], [{"question": "q", "choice": ["a", "b"], "answer": "b"}], "d2"]]
    src = tmp_path / "train.json"
    src.write_text(json.dumps(docs))
    examples, _ = _roundtrip("multiple_choice", src, tmp_path, [1])
    assert examples == docs


def test_chid_examples_are_lines_with_their_answers(tmp_path):
    src = tmp_path / "train.json"
    src.write_text(json.dumps({"content": ["x #idiom1# y"], "candidates": ["a", "b"]}) + "\n"
                   + json.dumps({"content": ["#idiom2# z #idiom3#"], "candidates": ["a", "b"]}) + "\n")
    (tmp_path / "train_answer.json").write_text(json.dumps({"#idiom1#": 0, "#idiom2#": 1, "#idiom3#": 0}))
    _, written = _roundtrip("chid", src, tmp_path, [1])
    assert json.loads((tmp_path / "fold_answer.json").read_text()) == {"#idiom2#": 1, "#idiom3#": 0}
    assert written.name == "fold.json"


def test_multi_task_refuses_cross_validation():
    with pytest.raises(UserError, match="multi_task"):
        TASKS.get("multi_task").examples({"a": "a.tsv"})
