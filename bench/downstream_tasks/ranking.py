"""Answer ranking on real reading-comprehension data: CMRC 2018 questions against each sentence of their
passage (DBQA-style), a sentence being correct when it contains the answer; the baseline ranks
sentences by the characters they share with the question."""

from __future__ import annotations

import json
import re
from pathlib import Path

SENTENCE_END = re.compile(r"(?<=[。！？!?])")


def sentences(context: str) -> list[str]:
    """A passage cut after each 。！？!? (the mark stays with its sentence); blank pieces dropped; tabs and
    newlines become spaces so a sentence fits a TSV field."""
    pieces = (re.sub(r"\s+", " ", s).strip() for s in SENTENCE_END.split(context))
    return [s for s in pieces if s]


def cmrc_ranking(source: Path, out: Path, first: int, count: int) -> Path:
    """A ranking TSV (``label<TAB>qid<TAB>text_a<TAB>text_b``) from a CMRC 2018 JSON file: passages
    ``first .. first+count-1`` (in file order), every question of each against every sentence of its
    passage, label 1 when the sentence contains the question's first reference answer. An answer that
    crosses a sentence boundary leaves its question without a correct candidate (skipped by MRR/MAP)."""
    data = json.loads(source.read_text(encoding="utf-8"))["data"]
    passages = [p for article in data for p in article["paragraphs"]][first:first + count]
    lines = ["label\tqid\ttext_a\ttext_b"]
    for passage in passages:
        candidates = sentences(passage["context"])
        for qa in passage["qas"]:
            answer, question = qa["answers"][0]["text"].strip(), re.sub(r"\s+", " ", qa["question"]).strip()
            lines += [f"{int(answer in s)}\t{qa['id']}\t{question}\t{s}" for s in candidates]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def overlap_scores(path: Path) -> list[float]:
    """The lexical-overlap baseline's score of every line of a ranking TSV: how many distinct characters
    of the question (letters and digits, no punctuation) the candidate contains."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return [float(len({c for c in q if c.isalnum()} & set(s))) for _, _, q, s in rows]


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    """Fine-tune the benchmark's small pre-trained Chinese BERT with ``--task ranking`` on CMRC 2018 dev
    passages (its test file's answers are withheld) and score it on later, disjoint passages."""
    import numpy as np
    from bench.downstream_tasks.common import finetune, pretrained_bert, small_bert

    from pentad.tasks.ranking import ranking_metrics

    cmrc, work = shared / "datasets" / "cmrc2018" / "dev.json", out_dir / "ranking"
    train = cmrc_ranking(cmrc, work / "train.tsv", first=0, count=40 if quick else 300)
    dev = cmrc_ranking(cmrc, work / "dev.tsv", first=700, count=20 if quick else 148)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("ranking", work / "run", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        f"train.epochs={1 if quick else 2}", "train.batch_size=32", "train.lr=1e-4"])
    rows = [line.split("\t") for line in dev.read_text(encoding="utf-8").splitlines()[1:]]
    overlap = ranking_metrics(np.array(overlap_scores(dev)), np.array([int(r[0]) for r in rows]),
                              [r[1] for r in rows])["mrr"]
    return {"task": "ranking", "dataset": "CMRC 2018 question-sentence pairs (dev passages 700+)", "metric": "mrr",
            "score": results["dev"]["mrr"], "baseline_name": "lexical overlap", "baseline": overlap,
            "seconds": seconds, "train_examples": len(train.read_text(encoding="utf-8").splitlines()) - 1}
