"""Regression on real sentences: the share of a sentence's characters that belong to named entities (PER,
LOC, ORG), derived from the tags of MSRA NER; the baseline predicts the training mean."""

from __future__ import annotations

from pathlib import Path


def msra_entity_share(source: Path, out: Path, rows: int = 0, start: int = 0) -> Path:
    """A regression TSV from an MSRA NER TSV (``text_a<TAB>label``, characters and BIO tags separated by
    spaces): text_a is the sentence (characters joined), label the fraction of its characters tagged as part
    of an entity (B-/I- tags), in [0, 1]. ``rows``: N sentences from the ``start``-th on (0: all)."""
    lines = source.read_text(encoding="utf-8").splitlines()[1:]
    lines = lines[start:start + rows] if rows else lines[start:]
    body = []
    for line in lines:
        chars, tags = line.split("\t")
        tagged = tags.split(" ")
        share = sum(t != "O" for t in tagged) / len(tagged)
        body.append(f"{share:.4f}\t{chars.replace(' ', '')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("label\ttext_a\n" + "\n".join(body) + "\n", encoding="utf-8")
    return out


def mean_baseline_mse(train: Path, dev: Path) -> float:
    """The baseline: the mean squared error on ``dev`` of always predicting the training labels' mean
    (its correlations are undefined: a constant)."""
    def labels(path: Path) -> list[float]:
        return [float(line.split("\t")[0]) for line in path.read_text(encoding="utf-8").splitlines()[1:]]

    train_labels, dev_labels = labels(train), labels(dev)
    mean = sum(train_labels) / len(train_labels)
    return sum((y - mean) ** 2 for y in dev_labels) / len(dev_labels)


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    """Fine-tune the benchmark's small pre-trained Chinese BERT with ``--task regression`` on MSRA NER's test
    sentences (no train split is shipped) and score it on its dev sentences (mse, lower is better; the
    run's Pearson and Spearman are in its results.json)."""
    from bench.downstream_tasks.common import finetune, pretrained_bert, small_bert

    msra, work = shared / "datasets" / "msra_ner", out_dir / "regression"
    train = msra_entity_share(msra / "test.tsv", work / "train.tsv", rows=1500 if quick else 0)
    dev = msra_entity_share(msra / "dev.tsv", work / "dev.tsv", rows=400 if quick else 0)
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("regression", work / "run", [
        *small_bert(shared, quick), f"init={init}", f"data.train={train}", f"data.dev={dev}",
        f"train.epochs={1 if quick else 4}", "train.batch_size=32", "train.lr=3e-4", "task.pooling=mean",
        "task.metric=mse"])
    return {"task": "regression", "dataset": "MSRA NER entity-character share (dev)",
            "metric": "mse (lower is better)", "score": results["dev"]["mse"],
            "baseline_name": "training mean", "baseline": mean_baseline_mse(train, dev), "seconds": seconds,
            "train_examples": len(train.read_text(encoding="utf-8").splitlines()) - 1}
