"""Book-review sentiment (TencentPretrain's quickstart set): classification from the small pre-trained BERT."""

from __future__ import annotations

from pathlib import Path

from bench.downstream_tasks.common import finetune, head_tsv, majority_accuracy, pretrained_bert, small_bert


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    data = shared / "datasets" / "book_review"
    train = head_tsv(data / "train.tsv", out_dir / "book_review" / "train.tsv", 2000 if quick else 20000)
    dev = head_tsv(data / "dev.tsv", out_dir / "book_review" / "dev.tsv", 500 if quick else 0)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("classification", out_dir / "classification", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        "train.epochs=1" if quick else "train.epochs=2", "train.batch_size=32", "train.lr=1e-4"])
    return {"task": "classification", "dataset": "book_review (dev)", "metric": "accuracy",
            "score": results["dev"]["accuracy"], "baseline_name": "majority class",
            "baseline": majority_accuracy(train, dev), "seconds": seconds,
            "train_examples": sum(1 for _ in open(train, encoding="utf-8")) - 1}
