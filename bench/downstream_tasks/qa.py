"""CMRC 2018 span-extraction QA: F1 (official rules) from the small pre-trained BERT.

The shared folder holds CMRC 2018's dev set (labelled) and test set (unlabelled), so the row trains on
the dev set's first articles and scores on the articles after them (disjoint paragraphs). Baseline:
the first characters of the context, as many as the training answers' mean length.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.downstream_tasks.common import finetune, pretrained_bert, small_bert


def split_articles(source: Path, out_dir: Path, train_questions: int, dev_questions: int) -> tuple[Path, Path]:
    """Two disjoint SQuAD files from ``source``'s articles: the first ``train_questions`` questions
    (whole articles, rounded up) and the next ``dev_questions``."""
    data = json.loads(source.read_text(encoding="utf-8"))
    parts: list[list[dict]] = [[], []]
    limits, count, part = (train_questions, train_questions + dev_questions), 0, 0
    for article in data["data"]:
        if count >= limits[part]:
            part += 1
            if part == 2:
                break
        parts[part].append(article)
        count += sum(len(p["qas"]) for p in article["paragraphs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / "train.json", out_dir / "dev.json")
    for path, articles in zip(paths, parts):
        path.write_text(json.dumps({"version": data.get("version"), "data": articles}, ensure_ascii=False),
                        encoding="utf-8")
    return paths


def first_characters_baseline(train: Path, dev: Path) -> float:
    """F1 on ``dev`` of answering with the context's first characters (the training answers' mean length)."""
    from pentad.tasks.qa import qa_metrics, read_squad

    train_questions, _ = read_squad(train, with_labels=True, on_bad_answer="skip")
    width = round(sum(q.end - q.start for q in train_questions) / len(train_questions))
    questions, _ = read_squad(dev, with_labels=True, on_bad_answer="skip")
    return qa_metrics([q.answers for q in questions], [q.context[:width] for q in questions])["f1"]


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    train, dev = split_articles(shared / "datasets" / "cmrc2018" / "dev.json", out_dir / "cmrc2018",
                                200 if quick else 1500, 100 if quick else 500)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("qa", out_dir / "qa", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        "data.objective.seq_length=256", "task.doc_stride=128", "task.on_bad_answer=skip",
        "train.epochs=1" if quick else "train.epochs=2", "train.batch_size=32", "train.lr=5e-4"])
    questions = sum(len(p["qas"]) for a in json.loads(train.read_text(encoding="utf-8"))["data"]
                    for p in a["paragraphs"])
    return {"task": "qa", "dataset": "cmrc2018 (dev, held-out articles)", "metric": "f1",
            "score": results["dev"]["f1"], "baseline_name": "first characters of the context",
            "baseline": first_characters_baseline(train, dev), "seconds": seconds, "train_examples": questions}
