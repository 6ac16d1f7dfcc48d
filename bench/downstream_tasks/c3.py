"""C3 multiple-choice reading comprehension from the small pre-trained BERT (its labelled dev.json split
by document: the first part trains, the rest scores)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.downstream_tasks.common import finetune, pretrained_bert, small_bert


def baselines(docs: list) -> dict[str, float]:
    """Accuracy on C3 documents of chance (the mean of 1/choices), the longest choice, and the choice
    with the most characters found in the context (ties: the first)."""
    chance = longest = overlap = total = 0.0
    for doc in docs:
        context = "".join(doc[0])
        for q in doc[1]:
            options, gold = q["choice"], q["choice"].index(q["answer"])
            chance += 1 / len(options)
            longest += max(range(len(options)), key=lambda i: len(options[i])) == gold
            overlap += max(range(len(options)), key=lambda i: sum(ch in context for ch in options[i])) == gold
            total += 1
    return {"chance": chance / total, "longest choice": longest / total, "context overlap": overlap / total}


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    docs = json.loads((shared / "datasets" / "c3" / "dev.json").read_text(encoding="utf-8"))
    # no train split in the shared folder: train on the first documents of dev.json, score on the last 600
    train_docs, dev_docs = (docs[:300], docs[-150:]) if quick else (docs[:-600], docs[-600:])
    data = out_dir / "c3"
    data.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train_docs), ("dev", dev_docs)):
        (data / f"{name}.json").write_text(json.dumps(part, ensure_ascii=False), encoding="utf-8")
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("multiple_choice", out_dir / "c3-run", [
        *small_bert(shared, quick), f"init={init}", f"data.train={data / 'train.json'}",
        f"data.dev={data / 'dev.json'}", "train.epochs=1" if quick else "train.epochs=2", "train.batch_size=16",
        "train.lr=1e-4"])
    base = baselines(dev_docs)
    return {"task": "multiple_choice", "dataset": "c3 (last documents of dev.json)", "metric": "accuracy",
            "score": results["dev"]["accuracy"], "baseline_name": "most characters in the context",
            "baseline": base["context overlap"], "seconds": seconds,
            "train_examples": sum(len(doc[1]) for doc in train_docs)}
