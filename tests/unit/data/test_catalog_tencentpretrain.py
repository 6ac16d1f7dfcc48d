"""The catalog's entries read from TencentPretrain's data directory (``--source DIR``), over tiny fake
copies of it built here: splits, halves, rows, the pre-training corpora and the missing-file errors."""

from __future__ import annotations

import json

import pytest

from pentad.cli.main import main
from pentad.data.catalog import prepare
from pentad.errors import UserError
from pentad.tasks.qa import read_squad


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture
def tp(tmp_path):
    """A TencentPretrain data directory in miniature."""
    root = tmp_path / "tp"
    (root / "models").mkdir(parents=True)
    for split, n in (("train", 5), ("dev", 3), ("test", 3)):
        _write(root / f"datasets/book_review/{split}.tsv",
               "label\ttext_a\n" + "".join(f"{i % 2}\t{split} review {i}\n" for i in range(n)))
    _write(root / "datasets/book_review/test_nolabel.tsv", "text_a\n" + "".join(f"test review {i}\n" for i in range(3)))

    def article(a, start):
        context = f"article {a} says hello"
        return {"title": f"t{a}", "paragraphs": [{"context": context, "qas": [
            {"id": f"Q{a}", "question": "what?", "answers": [{"text": "hello", "answer_start": start}]}]}]}
    # article 1 is in the first half (train) and its answer is not at its answer_start
    dev = {"version": "v1.0", "data": [article(0, 15), article(1, 3), article(2, 15), article(3, 15)]}
    _write(root / "datasets/cmrc2018/dev.json", json.dumps(dev))
    test = {"version": "v1.0", "data": [article(a, 15) for a in range(10, 13)]}
    _write(root / "datasets/cmrc2018/test.json", json.dumps(test))
    c3 = [[[f"context {i}"], [{"question": "q?", "choice": ["a", "b"], "answer": "a"}], f"{i}"] for i in range(5)]
    _write(root / "datasets/c3/dev.json", json.dumps(c3))
    _write(root / "datasets/c3/test.json", json.dumps(c3[:2]))
    ner = "text_a\tlabel\n" + "".join(f"字 {i}\tO O\n" for i in range(6))
    _write(root / "datasets/msra_ner/dev.tsv", ner)
    _write(root / "datasets/msra_ner/test.tsv", ner)
    _write(root / "datasets/msra_ner/test_nolabel.tsv", "text_a\n" + "".join(f"字 {i}\n" for i in range(6)))
    _write(root / "datasets/msra_ner/label2id.json", '{"O": 0, "B-LOC": 1, "I-LOC": 2}')
    _write(root / "corpora/news-commentary-v13-en-zh_sampled.txt",
           "".join(f"English {i}.\t中文 {i}。\n" for i in range(7)))
    return root


def test_book_review_splits_keep_rows_and_the_corpus_is_every_review(tp, tmp_path):
    assert main(["data", "prepare", "book_review", str(tmp_path / "br"), "--source", str(tp), "--rows", "2"]) == 0
    out = tmp_path / "br"
    assert _lines(out / "train.tsv") == ["label\ttext_a", "0\ttrain review 0", "1\ttrain review 1"]
    assert _lines(out / "test_nolabel.tsv") == ["text_a", "test review 0", "test review 1"]
    assert _lines(out / "corpus.txt") == [f"train review {i}" for i in range(5)]
    described = json.loads((out / "dataset.json").read_text())
    assert described["rows"] == {"train": 2, "dev": 2, "test": 2, "test_nolabel": 2, "corpus": 5}
    assert described["files"]["corpus"] == "corpus.txt" and "not the pre-training corpus" in described["notes"]
    prepare("book_review", tmp_path / "all", source=tp)
    assert len(_lines(tmp_path / "all/dev.tsv")) == 4 and "notes" not in json.loads(
        (tmp_path / "all/dataset.json").read_text())


@pytest.mark.parametrize("name,missing", [("book_review", "datasets/book_review/dev.tsv"),
                                          ("cmrc2018", "datasets/cmrc2018/test.json"),
                                          ("c3", "datasets/c3/dev.json"),
                                          ("msra_ner", "datasets/msra_ner/label2id.json"),
                                          ("en_zh", "corpora/news-commentary-v13-en-zh_sampled.txt")])
def test_a_missing_source_file_is_named(tp, tmp_path, name, missing):
    (tp / missing).unlink()
    with pytest.raises(UserError, match=f"--source {tp}: {missing} is missing there; expected TencentPretrain's "
                                        "data directory, the one holding datasets/, corpora/ and models/"):
        prepare(name, tmp_path / "out", source=tp)


def test_the_source_is_required_and_said(tmp_path, capsys):
    with pytest.raises(UserError, match="give --source DIR, TencentPretrain's data directory"):
        prepare("cmrc2018", tmp_path / "out")
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "en_zh\n" in out and "--source: TencentPretrain's data directory" in out


def test_cmrc2018_halves_its_dev_file_and_names_the_misplaced_answers(tp, tmp_path):
    prepared = prepare("cmrc2018", tmp_path / "cmrc", source=tp)
    out = tmp_path / "cmrc"
    train, dev = (json.loads((out / f"{s}.json").read_text()) for s in ("train", "dev"))
    assert [a["title"] for a in train["data"]] == ["t0", "t1"] and [a["title"] for a in dev["data"]] == ["t2", "t3"]
    assert train["version"] == "v1.0" and prepared.rows == {"train": 2, "dev": 2, "test": 3}
    assert "train.json: Q1)" in prepared.notes and "task.on_bad_answer=skip" in prepared.notes
    # the data is kept as it is; the qa task's reader finds the same question and skips it when told to
    assert train["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] == 3
    assert read_squad(out / "train.json", True, "skip")[1] == ["Q1"]
    with pytest.raises(UserError, match="task.on_bad_answer=skip"):
        read_squad(out / "train.json", True)
    prepared = prepare("cmrc2018", tmp_path / "one", rows=1, source=tp)
    assert prepared.rows == {"train": 1, "dev": 1, "test": 1} and not prepared.notes
    assert json.loads((tmp_path / "one/dev.json").read_text())["data"][0]["title"] == "t2"


def test_c3_and_msra_ner_train_on_the_first_half_of_dev(tp, tmp_path):
    prepared = prepare("c3", tmp_path / "c3", rows=2, source=tp)
    assert [d[2] for d in json.loads((tmp_path / "c3/train.json").read_text())] == ["0", "1"]
    assert [d[2] for d in json.loads((tmp_path / "c3/dev.json").read_text())] == ["2", "3"]
    assert prepared.rows == {"train": 2, "dev": 2, "test": 2}
    prepared = prepare("msra_ner", tmp_path / "ner", source=tp)
    assert _lines(tmp_path / "ner/train.tsv") == ["text_a\tlabel", "字 0\tO O", "字 1\tO O", "字 2\tO O"]
    assert _lines(tmp_path / "ner/dev.tsv")[1] == "字 3\tO O"
    assert prepared.rows == {"train": 3, "dev": 3, "test": 6, "test_nolabel": 6}
    assert json.loads((tmp_path / "ner/label2id.json").read_text()) == {"O": 0, "B-LOC": 1, "I-LOC": 2}


def test_en_zh_halves_with_a_header_and_the_whole_english_side(tp, tmp_path):
    prepared = prepare("en_zh", tmp_path / "mt", rows=2, source=tp)
    assert _lines(tmp_path / "mt/train.tsv") == ["text_a\tlabel", "English 0.\t中文 0。", "English 1.\t中文 1。"]
    assert _lines(tmp_path / "mt/dev.tsv")[1:] == ["English 3.\t中文 3。", "English 4.\t中文 4。"]
    assert _lines(tmp_path / "mt/en.txt") == [f"English {i}." for i in range(7)]
    assert prepared.rows == {"train": 2, "dev": 2, "english": 7}
    _write(tp / "corpora/news-commentary-v13-en-zh_sampled.txt", "a\tb\nc\td\te\n")
    with pytest.raises(UserError, match=r"news-commentary-v13-en-zh_sampled.txt, line 2: expected English<TAB>"
                                        r"Chinese \(one tab\); found 2 tabs"):
        prepare("en_zh", tmp_path / "bad", source=tp)


def test_bad_json_and_tsv_are_named(tp, tmp_path):
    _write(tp / "datasets/c3/dev.json", '[{"unclosed": ')
    with pytest.raises(UserError, match=r"c3/dev.json: not valid JSON \(line 1"):
        prepare("c3", tmp_path / "c3", source=tp)
    _write(tp / "datasets/cmrc2018/dev.json", '{"version": "v1.0"}')
    with pytest.raises(UserError, match="'data' is a list of articles; found dict with keys"):
        prepare("cmrc2018", tmp_path / "cmrc", source=tp)
    _write(tp / "datasets/book_review/train.tsv", "label\ttext_a\n1\tgood\n0\n")
    with pytest.raises(UserError, match=r"train.tsv, line 3: expected 2 tab-separated fields"):
        prepare("book_review", tmp_path / "br", source=tp)
