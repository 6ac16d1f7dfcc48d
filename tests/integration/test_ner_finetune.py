"""Token classification through ``pentad finetune --task ner``, ``pentad infer`` and ``pentad evaluate``: a
tiny BERT learns to tag person and place names (multi-word, split into several word pieces) in template
sentences, and dev scores and predictions come out in the TSV layout."""

from __future__ import annotations

import json
import random

import pytest

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

PEOPLE = ["mary", "john smith", "li wei", "anna karenina", "omar", "sophie martin", "kenji", "ravi kumar"]
PLACES = ["paris", "new york", "beijing", "cape town", "lima", "san francisco", "oslo", "hong kong"]
TEMPLATES = ["{p} lives in {l}", "yesterday {p} flew to {l} with friends", "{p} likes the food in {l}",
             "the weather in {l} surprised {p}", "we met {p} near the station of {l}",
             "{p} and {q} moved to {l} last year", "everyone in {l} knows {p}"]


def tagged(name: str, kind: str) -> list[tuple[str, str]]:
    words = name.split()
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def sentence(rng: random.Random) -> list[tuple[str, str]]:
    template = rng.choice(TEMPLATES)
    p, q = rng.sample(PEOPLE, 2)
    out: list[tuple[str, str]] = []
    for word in template.split():
        if word in ("{p}", "{q}"):
            out += tagged(p if word == "{p}" else q, "PER")
        elif word == "{l}":
            out += tagged(rng.choice(PLACES), "LOC")
        else:
            out.append((word, "O"))
    return out


@pytest.fixture(scope="module")
def ner_data(tmp_path_factory):
    from pentad.data.vocab_builder import build_vocab

    root = tmp_path_factory.mktemp("ner")
    rng = random.Random(0)
    splits = {"train": [sentence(rng) for _ in range(160)], "dev": [sentence(rng) for _ in range(40)]}
    for name, rows in splits.items():
        (root / f"{name}.tsv").write_text("text_a\tlabel\n" + "".join(
            " ".join(w for w, _ in r) + "\t" + " ".join(t for _, t in r) + "\n" for r in rows), encoding="utf-8")
    (root / "nolabel.tsv").write_text("text_a\n" + "".join(" ".join(w for w, _ in r) + "\n"
                                                           for r in splits["dev"][:5]), encoding="utf-8")
    # A small vocabulary, so that most names split into several pieces.
    (root / "corpus.txt").write_text("\n".join(" ".join(w for w, _ in r) for r in splits["train"]) + "\n",
                                     encoding="utf-8")
    build_vocab([root / "corpus.txt"], "wordpiece", 120, root / "vocab", lowercase=True, min_frequency=1,
                show_progress=False)
    return root, splits


@pytest.mark.parametrize("crf", [False, True], ids=["softmax", "crf"])
def test_ner_finetunes_evaluates_and_predicts(ner_data, tmp_path, crf):
    root, splits = ner_data
    out = tmp_path / "run"
    assert main(["finetune", "--task", "ner", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={root / 'vocab' / 'vocab.txt'}", "model.hidden_size=64", "model.max_seq_length=32",
                 "model.encoder.num_layers=2", "model.encoder.num_heads=2", "model.encoder.ffn_size=128",
                 f"data.train={root / 'train.tsv'}", f"data.dev={root / 'dev.tsv'}", f"output={out}",
                 "train.epochs=20", "train.batch_size=16", "train.lr=2e-3", "train.progress=false",
                 "train.log_every=10", "task.head_dropout=0.0", f"task.crf={str(crf).lower()}"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["dev"]) == {"f1", "precision", "recall", "accuracy"}
    assert results["dev"]["f1"] >= 0.85, results  # 0.94 measured; all-O scores 0
    assert json.loads((out / "labels.json").read_text())["labels"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    losses = [r["loss"] for r in MetricsLog(out / "metrics.jsonl").read() if "loss" in r]
    assert losses[-1] < 0.3 * losses[0]

    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={root / 'nolabel.tsv'}", "--output", str(pred),
                 "--probabilities"]) == 0
    lines = pred.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "label\tprob" and len(lines) == 6
    for line, gold in zip(lines[1:], splits["dev"][:5]):
        tags, probs = line.split("\t")
        assert len(tags.split(" ")) == len(gold) and len(probs.split(" ")) == len(gold)
        assert all(0.0 < float(p) <= 1.0 for p in probs.split(" "))
    # pentad evaluate on the dev file gives the span F1 etc. fine-tuning picked the best model by
    scores = tmp_path / "dev_scores.json"
    assert main(["evaluate", "--model", str(out), f"data.test={root / 'dev.tsv'}", "--output", str(scores)]) == 0
    assert json.loads(scores.read_text(encoding="utf-8")) == results["dev"]
