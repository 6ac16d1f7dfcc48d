"""Fixtures for whole-command tests: a tiny English corpus, vocabulary and TSVs made in tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import TP

SENTENCES = [
    "the film was a delight from start to finish", "a dull and lifeless story with no heart",
    "the actors carry the weak script", "i loved the music and the colours",
    "nothing in this movie works", "a smart funny and moving picture",
    "the plot makes no sense at all", "one of the best films of the year",
    "the ending falls flat", "a warm and generous comedy",
]


@pytest.fixture(scope="session")
def english(tmp_path_factory) -> dict[str, Path]:
    """A vocabulary built from a small corpus, the corpus in bert and line formats, and TSVs."""
    from pentad.data.vocab_builder import build_vocab

    root = tmp_path_factory.mktemp("english")
    docs = []
    for d in range(40):
        docs.append([SENTENCES[(d + k) % len(SENTENCES)] + " ." for k in range(4)])
    (root / "bert.txt").write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    (root / "docs.txt").write_text("\n".join(" ".join(doc) for doc in docs) + "\n", encoding="utf-8")
    build_vocab([root / "docs.txt"], "wordpiece", 200, root / "vocab", lowercase=True, min_frequency=1,
                show_progress=False)
    rows = [(1 - i % 2, SENTENCES[i % len(SENTENCES)]) for i in range(60)]
    for split, part in (("train", rows[:40]), ("dev", rows[40:50]), ("test", rows[50:])):
        (root / f"{split}.tsv").write_text("label\ttext_a\n" + "".join(f"{y}\t{t}\n" for y, t in part),
                                           encoding="utf-8")
    (root / "nolabel.tsv").write_text("text_a\n" + "".join(f"{t}\n" for _, t in rows[50:]), encoding="utf-8")
    return {"root": root, "vocab": root / "vocab" / "vocab.txt", "bert": root / "bert.txt",
            "docs": root / "docs.txt", "train": root / "train.tsv", "dev": root / "dev.tsv",
            "test": root / "test.tsv", "nolabel": root / "nolabel.tsv"}


def tiny(vocab: Path) -> list[str]:
    """Overrides that shrink bert/tiny further and point it at ``vocab`` (no loss.png: drawing it takes
    longer than training these models; tests/integration/test_pipeline.py draws one)."""
    return ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}", "model.hidden_size=32",
            "model.max_seq_length=64", "model.encoder.num_layers=2", "model.encoder.num_heads=2",
            "model.encoder.ffn_size=64", "data.objective.seq_length=32", "train.batch_size=8",
            "train.progress=false", "train.log_every=1", "train.lr=1e-3", "train.plot=false"]


@pytest.fixture(scope="session")
def tp():
    if not TP.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    return TP


@pytest.fixture(scope="session")
def classification_run(english, tmp_path_factory) -> Path:
    """A tiny classification run fine-tuned for one epoch on ``english``'s train.tsv (shared: fine-tuning
    takes most of a test module's time)."""
    from pentad.cli.main import main

    out = tmp_path_factory.mktemp("classification") / "ft"
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                 f"data.train={english['train']}", "train.epochs=1", f"output={out}"]) == 0
    return out


@pytest.fixture(scope="session")
def bert_dataset(english, tmp_path_factory) -> Path:
    """``english``'s BERT corpus preprocessed for the tiny bert recipe (shared by the modules that pre-train
    on it; read only)."""
    from pentad.cli.main import main

    out = tmp_path_factory.mktemp("bert_dataset") / "ds"
    assert main(["preprocess", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.corpus={english['bert']}",
                 f"data.output={out}"]) == 0
    return out
