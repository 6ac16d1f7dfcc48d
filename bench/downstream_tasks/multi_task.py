"""Multi-task classification: book-review sentiment and "does the sentence name a person" (derived from MSRA
NER's tags) in one run, one shared encoder and a head each; the baseline is each dataset's majority class."""

from __future__ import annotations

import json
from pathlib import Path


def msra_person(source: Path, out: Path, rows: int, start: int = 0) -> Path:
    """A classification TSV from an MSRA NER TSV (``text_a<TAB>label``, characters and BIO tags separated by
    spaces): label 1 when the sentence's tags mark a person (B-PER), else 0; text_a the characters joined.
    Balanced: ``rows`` // 2 sentences of each label, from the ``start``-th sentence of each kind on."""
    lines = source.read_text(encoding="utf-8").splitlines()[1:]
    kinds: dict[int, list[str]] = {0: [], 1: []}
    for line in lines:
        chars, tags = line.split("\t")
        kinds[int("B-PER" in tags.split(" "))].append(chars.replace(" ", ""))
    half = rows // 2
    picked = [(label, text) for label in (0, 1) for text in kinds[label][start:start + half]]
    picked.sort(key=lambda p: (sum(map(ord, p[1])) % 997, p[1]))  # interleave the labels, deterministically
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("label\ttext_a\n" + "".join(f"{y}\t{t}\n" for y, t in picked), encoding="utf-8")
    return out


def datasets_override(datasets: list[dict]) -> str:
    """The ``task.datasets=...`` override for a list of {name, train, dev, test} dicts."""
    return "task.datasets=" + json.dumps([{k: str(v) for k, v in d.items()} for d in datasets])


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    """Fine-tune the benchmark's small pre-trained Chinese BERT with ``--task multi_task`` on book_review and
    the MSRA person set; scores are the mean dev accuracy and each dataset's."""
    from bench.downstream_tasks.common import finetune, head_tsv, majority_accuracy, pretrained_bert, small_bert

    work = out_dir / "multi_task"
    book, msra = shared / "datasets" / "book_review", shared / "datasets" / "msra_ner"
    n = 400 if quick else 10000
    sentiment = {"name": "sentiment", "train": head_tsv(book / "train.tsv", work / "sentiment" / "train.tsv", n),
                 "dev": head_tsv(book / "dev.tsv", work / "sentiment" / "dev.tsv", 400 if quick else 0)}
    person = {"name": "person", "train": msra_person(msra / "test.tsv", work / "person" / "train.tsv", n),
              "dev": msra_person(msra / "dev.tsv", work / "person" / "dev.tsv", 400 if quick else 1000)}
    init = pretrained_bert(out_dir, shared, quick)
    results, seconds = finetune("multi_task", work / "run", [
        *small_bert(shared, quick), f"init={init}", datasets_override([sentiment, person]),
        "train.epochs=4" if quick else "train.epochs=2", "train.batch_size=16", "train.lr=1e-3", "train.warmup=0",
        "train.adam_bias_correction=true"])
    baselines = [majority_accuracy(d["train"], d["dev"]) for d in (sentiment, person)]
    dev = results["dev"]
    return {"task": "multi_task", "dataset": "book_review + MSRA person (dev)", "metric": "mean_accuracy",
            "score": dev["mean_accuracy"], "baseline_name": "majority class of each",
            "baseline": sum(baselines) / len(baselines), "seconds": seconds,
            "train_examples": sum(sum(1 for _ in open(d["train"], encoding="utf-8")) - 1 for d in (sentiment, person)),
            "detail": {k: round(v, 4) for k, v in dev.items() if k.endswith("/accuracy")}}
