"""Datasets made from a local copy of TencentPretrain's data directory (``--source DIR``: the directory
holding ``datasets/``, ``corpora/`` and ``models/``): Chinese book-review sentiment with its review text as
a pre-training corpus, CMRC 2018 and C3 reading comprehension, MSRA NER, and English-Chinese news
commentary for translation with its English side as a language-model corpus.

That copy has no training split of CMRC 2018, C3 and MSRA NER and keeps the news commentary in one
file: those entries cut the file in two, the first half the training split and the second the dev
split (``--rows N`` then keeps the first N of each half). A pre-training corpus beside the splits
(book_review's ``corpus.txt``, en_zh's ``en.txt``) is written whole whatever ``--rows``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pentad.data.catalog import DATASETS, Prepared, PreparedDataset, copy_head
from pentad.errors import UserError
from pentad.files import atomic_write_text

NEEDS_SOURCE = ("TencentPretrain's data directory, the one holding datasets/, corpora/ and models/ "
                "(from https://github.com/Tencent/TencentPretrain)")

# a pre-training corpus is written whole: a few rows of it would not fill one batch, and preprocess reads
# the whole of one in seconds
WHOLE_CORPUS = "{corpus} holds {whole}: --rows limits the splits, not the pre-training corpus"


def source_file(source: Path, relative: str) -> Path:
    """``source/relative``, or an error naming the missing file."""
    path = source / relative
    if not path.is_file():
        raise UserError(f"--source {source}: {relative} is missing there; expected {NEEDS_SOURCE}, "
                        f"which has {relative}.")
    return path


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); expected TencentPretrain's JSON file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def halves(items: list[Any], rows: int | None) -> dict[str, list[Any]]:
    """The first half of ``items`` as ``train``, the second as ``dev``; the first ``rows`` of each."""
    middle = len(items) // 2
    return {"train": items[:middle][:rows], "dev": items[middle:][:rows]}


def write_json_file(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, ensure_ascii=False) + "\n")


def tsv_column(path: Path, column: str) -> list[str]:
    """The ``column`` field of every row of the TSV ``path`` (named in its header line)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t") if lines else []
    if column not in header:
        raise UserError(f"{path}: line 1 must be a header naming the column {column!r}; found {header}")
    index, values = header.index(column), []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}, line {number}: expected {len(header)} tab-separated fields "
                            f"({', '.join(header)}); found {len(fields)}")
        values.append(fields[index])
    return values


class TencentPretrainDataset(PreparedDataset):
    """An entry read from TencentPretrain's data directory (``--source DIR``)."""

    needs_source = NEEDS_SOURCE


@DATASETS.register("book_review")
class BookReview(TencentPretrainDataset):
    summary = ("Chinese book-review sentiment (TencentPretrain's datasets/book_review): train/dev/test/"
               "test_nolabel.tsv, label<TAB>text_a; corpus.txt: every review of train.tsv, one per line "
               "(whatever --rows)")
    task = "finetune --task classification (corpus.txt: preprocess data.objective=mlm)"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        assert source is not None
        files = {split: source_file(source, f"datasets/book_review/{split}.tsv")
                 for split in ("train", "dev", "test", "test_nolabel")}
        prepared = Prepared(source=f"{source}/datasets/book_review (TencentPretrain)")
        for split, path in files.items():
            prepared.files[split] = f"{split}.tsv"
            prepared.rows[split] = copy_head(path, output / f"{split}.tsv", rows)
        reviews = tsv_column(files["train"], "text_a")
        atomic_write_text(output / "corpus.txt", "".join(review + "\n" for review in reviews))
        prepared.files["corpus"], prepared.rows["corpus"] = "corpus.txt", len(reviews)
        if rows is not None:
            prepared.notes = WHOLE_CORPUS.format(corpus="corpus.txt", whole="every review of the source's train.tsv")
        return prepared


def misplaced_answers(document: Any) -> list[str]:
    """The ids of the questions of a SQuAD/CMRC document none of whose answers is at its
    ``answer_start`` in the context (what ``finetune --task qa`` refuses unless told to skip)."""
    found = []
    for article in document.get("data", []) if isinstance(document, dict) else []:
        for paragraph in article.get("paragraphs", []) if isinstance(article, dict) else []:
            context = paragraph.get("context", "") if isinstance(paragraph, dict) else ""
            for qa in paragraph.get("qas", []) if isinstance(paragraph, dict) else []:
                answers = qa.get("answers", []) if isinstance(qa, dict) else []
                if not any(isinstance(a, dict) and isinstance(a.get("text"), str) and a["text"].strip()
                           and isinstance(a.get("answer_start"), int) and a["answer_start"] >= 0
                           and context[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
                           for a in answers):
                    found.append(str(qa.get("id")) if isinstance(qa, dict) else "?")
    return found


def squad_articles(path: Path) -> tuple[dict[str, Any], list[Any]]:
    document = read_json(path)
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise UserError(f"{path}: expected SQuAD/CMRC 2018 JSON, an object whose 'data' is a list of articles; "
                        f"found {type(document).__name__}" + (f" with keys {sorted(document)}"
                                                              if isinstance(document, dict) else ""))
    return document, document["data"]


@DATASETS.register("cmrc2018")
class Cmrc2018(TencentPretrainDataset):
    summary = ("CMRC 2018 span-extraction reading comprehension (TencentPretrain's datasets/cmrc2018, SQuAD's "
               "JSON): train.json and dev.json the halves of its dev.json, test.json; --rows counts articles")
    task = "finetune --task qa"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        assert source is not None
        dev_path = source_file(source, "datasets/cmrc2018/dev.json")
        test_path = source_file(source, "datasets/cmrc2018/test.json")
        document, articles = squad_articles(dev_path)
        test_document, test_articles = squad_articles(test_path)
        prepared = Prepared(source=f"{source}/datasets/cmrc2018 (TencentPretrain): train and dev are the first "
                                   "and second half of its dev.json")
        splits = {**halves(articles, rows), "test": test_articles[:rows]}
        misplaced: dict[str, list[str]] = {}
        for split, part in splits.items():
            written = {**(test_document if split == "test" else document), "data": part}
            write_json_file(output / f"{split}.json", written)
            prepared.files[split], prepared.rows[split] = f"{split}.json", len(part)
            if split != "test" and (ids := misplaced_answers(written)):
                misplaced[split] = ids
        if misplaced:
            listed = "; ".join(f"{split}.json: {', '.join(ids)}" for split, ids in misplaced.items())
            prepared.notes = (f"questions with no answer at their answer_start ({listed}), kept as in the source: "
                              "finetune --task qa stops at them unless given task.on_bad_answer=skip, which "
                              "leaves them out and counts them")
        return prepared


@DATASETS.register("c3")
class C3(TencentPretrainDataset):
    summary = ("C3 multiple-choice reading comprehension (TencentPretrain's datasets/c3): train.json and "
               "dev.json the halves of its dev.json, test.json; --rows counts documents")
    task = "finetune --task multiple_choice"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        assert source is not None
        paths = {"dev": source_file(source, "datasets/c3/dev.json"),
                 "test": source_file(source, "datasets/c3/test.json")}
        documents = {}
        for name, path in paths.items():
            documents[name] = read_json(path)
            if not isinstance(documents[name], list):
                raise UserError(f"{path}: expected C3's JSON, a list of [context lines, questions, id] "
                                f"documents; found {type(documents[name]).__name__}")
        prepared = Prepared(source=f"{source}/datasets/c3 (TencentPretrain): train and dev are the first and "
                                   "second half of its dev.json")
        for split, part in {**halves(documents["dev"], rows), "test": documents["test"][:rows]}.items():
            write_json_file(output / f"{split}.json", part)
            prepared.files[split], prepared.rows[split] = f"{split}.json", len(part)
        return prepared


@DATASETS.register("msra_ner")
class MsraNer(TencentPretrainDataset):
    summary = ("MSRA named entities (TencentPretrain's datasets/msra_ner): train.tsv and dev.tsv the halves of "
               "its dev.tsv, test.tsv, test_nolabel.tsv, text_a<TAB>label; label2id.json")
    task = "finetune --task ner (task.labels_file=DIR/label2id.json)"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        assert source is not None
        dev = source_file(source, "datasets/msra_ner/dev.tsv")
        tests = {split: source_file(source, f"datasets/msra_ner/{split}.tsv") for split in ("test", "test_nolabel")}
        labels = source_file(source, "datasets/msra_ner/label2id.json")
        prepared = Prepared(source=f"{source}/datasets/msra_ner (TencentPretrain): train and dev are the first "
                                   "and second half of its dev.tsv")
        lines = dev.read_text(encoding="utf-8").splitlines(True)
        if not lines or "text_a" not in lines[0].rstrip("\n").split("\t"):
            raise UserError(f"{dev}: line 1 must be the header text_a<TAB>label; found {lines[:1]}")
        for split, part in halves(lines[1:], rows).items():
            atomic_write_text(output / f"{split}.tsv", lines[0] + "".join(part))
            prepared.files[split], prepared.rows[split] = f"{split}.tsv", len(part)
        for split, path in tests.items():
            prepared.files[split] = f"{split}.tsv"
            prepared.rows[split] = copy_head(path, output / f"{split}.tsv", rows)
        if not isinstance(read_json(labels), dict):
            raise UserError(f"{labels}: expected the tag set as a JSON object {{tag: id}}")
        copy_head(labels, output / "label2id.json", None, header=False)
        prepared.files["labels"] = "label2id.json"
        return prepared


@DATASETS.register("en_zh")
class EnglishChinese(TencentPretrainDataset):
    summary = ("English-Chinese news commentary (TencentPretrain's corpora/news-commentary-v13-en-zh_sampled"
               ".txt): train.tsv and dev.tsv its halves, text_a (English)<TAB>label (Chinese); en.txt: the "
               "English side of the whole file, one sentence per line (whatever --rows)")
    task = "finetune --task text2text (en.txt: preprocess data.objective=lm)"
    corpus = "corpora/news-commentary-v13-en-zh_sampled.txt"

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        assert source is not None
        path = source_file(source, self.corpus)
        pairs = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            if line.count("\t") != 1:
                raise UserError(f"{path}, line {number}: expected English<TAB>Chinese (one tab); found "
                                f"{line.count(chr(9))} tabs")
            pairs.append(line)
        prepared = Prepared(source=f"{source}/{self.corpus} (TencentPretrain): train and dev are its first and "
                                   "second half")
        for split, part in halves(pairs, rows).items():
            atomic_write_text(output / f"{split}.tsv", "text_a\tlabel\n" + "".join(p + "\n" for p in part))
            prepared.files[split], prepared.rows[split] = f"{split}.tsv", len(part)
        english = [pair.split("\t")[0] for pair in pairs]
        atomic_write_text(output / "en.txt", "".join(e + "\n" for e in english))
        prepared.files["english"], prepared.rows["english"] = "en.txt", len(english)
        if rows is not None:
            prepared.notes = WHOLE_CORPUS.format(corpus="en.txt", whole="the English side of every line")
        return prepared
