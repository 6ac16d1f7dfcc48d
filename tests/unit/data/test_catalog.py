"""``pentad data prepare`` / ``pentad data list``: the dataset catalog's contract (rows, sources,
dataset.json, errors) and the text entries over stand-in caches (no download)."""

from __future__ import annotations

import json

import pytest

from pentad.cli.main import main
from pentad.data import assets
from pentad.data.catalog import DATASETS, Prepared, PreparedDataset, copy_head, prepare
from pentad.errors import UserError


class _Local(PreparedDataset):
    summary = "a test dataset read from a local copy"
    task = "finetune --task classification"
    needs_source = "a directory holding train.tsv"

    def write(self, output, rows, source, cache):
        return Prepared(files={"train": "train.tsv"}, source=str(source),
                        rows={"train": copy_head(source / "train.tsv", output / "train.tsv", rows)})


@pytest.fixture
def local_entry(monkeypatch):
    monkeypatch.setitem(DATASETS._entries, "local-test", _Local)
    return "local-test"


def _tsv(path, n):
    path.write_text("label\ttext_a\n" + "".join(f"{i % 2}\tsentence {i}\n" for i in range(n)), encoding="utf-8")


def test_rows_keep_the_first_examples_and_the_description_names_them(tmp_path, local_entry):
    _tsv(tmp_path / "train.tsv", 10)
    prepare(local_entry, tmp_path / "out", rows=3, source=tmp_path)
    assert (tmp_path / "out/train.tsv").read_text().splitlines() == ["label\ttext_a", "0\tsentence 0",
                                                                     "1\tsentence 1", "0\tsentence 2"]
    described = json.loads((tmp_path / "out/dataset.json").read_text())
    assert described["files"] == {"train": "train.tsv"} and described["rows"] == {"train": 3}
    assert described["rows_limit"] == 3 and described["name"] == local_entry
    prepare(local_entry, tmp_path / "all", source=tmp_path)
    assert json.loads((tmp_path / "all/dataset.json").read_text())["rows"] == {"train": 10}


def test_source_errors_name_the_option(tmp_path, local_entry):
    with pytest.raises(UserError, match="give --source DIR, a directory holding train.tsv"):
        prepare(local_entry, tmp_path / "out")
    with pytest.raises(UserError, match="no such directory"):
        prepare(local_entry, tmp_path / "out", source=tmp_path / "missing")
    with pytest.raises(UserError, match="fetches its own source"):
        prepare("mr", tmp_path / "out", source=tmp_path)
    with pytest.raises(UserError, match="--rows must be a positive"):
        prepare(local_entry, tmp_path / "out", rows=0, source=tmp_path)
    with pytest.raises(UserError, match="unknown dataset 'mrr'; did you mean 'mr'"):
        prepare("mrr", tmp_path / "out")


def test_movie_reviews_from_the_cache(tmp_path, monkeypatch):
    splits = {}
    for split in ("train", "dev", "test", "test_nolabel"):
        _tsv(tmp_path / f"{split}.tsv", 6)
        splits[split] = tmp_path / f"{split}.tsv"
    fake = assets.SentimentSplits(tmp_path, splits["train"], splits["dev"], splits["test"], splits["test_nolabel"],
                                  {"train": 6, "dev": 6, "test": 6}, {"train": 0.5, "dev": 0.5, "test": 0.5})
    monkeypatch.setattr(assets, "ensure_mr_sentiment", lambda cache: fake)
    assert main(["data", "prepare", "mr", str(tmp_path / "mr"), "--rows", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "mr").iterdir()) == ["dataset.json", "dev.tsv", "test.tsv",
                                                                 "test_nolabel.tsv", "train.tsv"]
    assert len((tmp_path / "mr/dev.tsv").read_text().splitlines()) == 3


def test_wikipedia_rows_are_whole_articles(tmp_path, monkeypatch):
    docs, sentences = tmp_path / "docs.txt", tmp_path / "sentences.txt"
    docs.write_text("A b. C d.\nE f.\nG h.\n", encoding="utf-8")
    sentences.write_text("A b.\nC d.\n\nE f.\n\nG h.\n", encoding="utf-8")
    monkeypatch.setattr(assets, "ensure_wikipedia_corpus",
                        lambda cache: assets.WikiCorpus(sentences, docs, 3, 4, 8))
    prepared = prepare("wikipedia", tmp_path / "wiki", rows=2)
    assert (tmp_path / "wiki/docs.txt").read_text() == "A b. C d.\nE f.\n"
    assert (tmp_path / "wiki/sentences.txt").read_text() == "A b.\nC d.\n\nE f.\n"
    assert prepared.rows == {"docs": 2, "sentences": 3}


def test_list_names_every_dataset(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}\n" in out for name in DATASETS.names()) and "read by: pentad finetune" in out


def test_mnist_copies_the_images_its_rows_name(tmp_path, monkeypatch):
    source = tmp_path / "cache"
    (source / "images").mkdir(parents=True)
    splits = {}
    for offset, split in enumerate(("train", "dev", "test")):
        names = [f"images/{offset}{i}.png" for i in range(4)]
        for name in names:
            (source / name).write_bytes(b"png " + name.encode())
        (source / f"{split}.tsv").write_text("label\tpath\n" + "".join(f"{i}\t{n}\n" for i, n in enumerate(names)))
        splits[split] = source / f"{split}.tsv"
    fake = assets.ImageSplits(source, splits["train"], splits["dev"], splits["test"], {"train": 4, "dev": 4, "test": 4})
    monkeypatch.setattr(assets, "ensure_mnist", lambda cache: fake)
    prepared = prepare("mnist", tmp_path / "mnist", rows=2)
    out = tmp_path / "mnist"
    assert prepared.rows == {"train": 2, "dev": 2, "test": 2}
    assert sorted(p.name for p in (out / "images").iterdir()) == ["00.png", "01.png", "10.png", "11.png",
                                                                 "20.png", "21.png"]
    assert (out / "images/21.png").read_bytes() == b"png images/21.png"
    assert (out / "test.tsv").read_text().splitlines() == ["label\tpath", "0\timages/20.png", "1\timages/21.png"]
