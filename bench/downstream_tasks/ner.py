"""MSRA NER: entity F1 from the small pre-trained BERT (trained on test.tsv, scored on dev.tsv)."""

from __future__ import annotations

from pathlib import Path

from bench.downstream_tasks.common import finetune, head_tsv, pretrained_bert, small_bert


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    data = shared / "datasets" / "msra_ner"
    # no train split in the shared folder: train on test.tsv, score on dev.tsv (disjoint)
    train = head_tsv(data / "test.tsv", out_dir / "msra_ner" / "train.tsv", 1000 if quick else 0)
    dev = head_tsv(data / "dev.tsv", out_dir / "msra_ner" / "dev.tsv", 300 if quick else 0)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("ner", out_dir / "ner", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        f"task.labels_file={data / 'label2id.json'}", "train.epochs=1" if quick else "train.epochs=2",
        "train.batch_size=32", "train.lr=5e-4"])
    return {"task": "ner", "dataset": "msra_ner (dev)", "metric": "f1", "score": results["dev"]["f1"],
            "baseline_name": "all 'O'", "baseline": 0.0, "seconds": seconds,
            "train_examples": sum(1 for _ in open(train, encoding="utf-8")) - 1}
