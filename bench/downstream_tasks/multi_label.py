"""Multi-label classification on real sentences: which entity types (PER, LOC, ORG) a sentence of MSRA
NER mentions, derived from its tags; the baseline is the best constant label set."""

from __future__ import annotations

import itertools
from pathlib import Path

TYPES = ("LOC", "ORG", "PER")


def msra_multi_label(source: Path, out: Path, rows: int = 0, start: int = 0) -> Path:
    """A multi-label TSV from an MSRA NER TSV (``text_a<TAB>label``, characters and BIO tags separated by
    spaces): text_a is the sentence (characters joined), label the sorted entity types its tags mention,
    comma-separated, empty for a sentence without entities. ``rows``: N sentences from the ``start``-th on (0: all)."""
    lines = source.read_text(encoding="utf-8").splitlines()[1:]
    lines = lines[start:start + rows] if rows else lines[start:]
    out.parent.mkdir(parents=True, exist_ok=True)
    body = []
    for line in lines:
        chars, tags = line.split("\t")
        found = sorted({tag[2:] for tag in tags.split(" ") if tag.startswith("B-")})
        body.append(f"{','.join(found)}\t{chars.replace(' ', '')}")
    out.write_text("label\ttext_a\n" + "\n".join(body) + "\n", encoding="utf-8")
    return out


def label_sets(path: Path) -> list[set[str]]:
    """The label set of every row of a multi-label TSV (header ``label<TAB>text_a``)."""
    rows = path.read_text(encoding="utf-8").splitlines()[1:]
    return [set(filter(None, row.split("\t")[0].split(","))) for row in rows]


def best_constant(train: Path, dev: Path) -> tuple[float, tuple[str, ...]]:
    """The baseline: of every constant prediction (a fixed subset of the labels for every sentence), the one
    with the best micro-F1 on ``train``; returns its micro-F1 on ``dev`` and the subset."""
    def micro_f1(constant: set[str], gold: list[set[str]]) -> float:
        tp = sum(len(constant & g) for g in gold)
        fp = sum(len(constant - g) for g in gold)
        fn = sum(len(g - constant) for g in gold)
        return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0

    train_sets, dev_sets = label_sets(train), label_sets(dev)
    labels = sorted(set().union(*train_sets))
    subsets = [set(c) for k in range(len(labels) + 1) for c in itertools.combinations(labels, k)]
    best = max(subsets, key=lambda s: micro_f1(s, train_sets))
    return micro_f1(best, dev_sets), tuple(sorted(best))


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    """Fine-tune a tiny BERT (L=1/H=64) **from random weights** with ``--task multi_label`` on MSRA NER's test
    sentences (no train split is shipped) and score it on its dev sentences.

    Random weights, not the benchmark's small pre-trained BERT: with that model (and fine-tuning rates from
    1e-4 to 2e-3, 150-200 steps) every label's probability stayed under 0.5 and micro-F1 at 0, while this
    tiny model learns the entity types in a few hundred steps (the integration test's setting)."""
    from bench.downstream_tasks.common import ZH_VOCAB, finetune

    msra, work = shared / "datasets" / "msra_ner", out_dir / "multi_label"
    train = msra_multi_label(msra / "test.tsv", work / "train.tsv", rows=1200 if quick else 0)
    dev = msra_multi_label(msra / "dev.tsv", work / "dev.tsv", rows=400 if quick else 0)
    results, seconds = finetune("multi_label", work / "run", [
        "--config", "bert/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={shared / ZH_VOCAB}",
        "model.hidden_size=64", "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
        "model.encoder.ffn_size=128", f"data.train={train}", f"data.dev={dev}", f"train.epochs={8 if quick else 6}",
        "train.batch_size=16", "train.lr=3e-3", "train.adam_bias_correction=true", "train.progress=false",
        "task.head_dropout=0", "task.pooling=mean"])
    baseline, constant = best_constant(train, dev)
    return {"task": "multi_label", "dataset": "MSRA NER entity types (dev)", "metric": "micro_f1",
            "score": results["dev"]["micro_f1"], "baseline_name": f"best constant set {{{','.join(constant)}}}",
            "baseline": baseline, "seconds": seconds, "train_examples": len(label_sets(train))}
