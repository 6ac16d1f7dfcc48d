"""English -> Chinese news commentary (TencentPretrain's 1,000-pair sample): text2text with a small
T5-style encoder-decoder from random weights (no pre-trained sequence-to-sequence model is at hand;
the shared small BERT has no decoder), against the same model untrained.

The vocabulary is a WordPiece vocabulary learnt from the training pairs (every Chinese character a
token, English word pieces): a few thousand entries instead of BERT's 21,128 make the vocabulary
projection, which dominates a small model's step, several times cheaper."""

from __future__ import annotations

from pathlib import Path

from bench.downstream_tasks.common import finetune

CORPUS = "corpora/news-commentary-v13-en-zh_sampled.txt"
DEV_EVERY = 20  # every 20th pair is held out for dev (50 pairs)


def split(shared: Path, out: Path) -> tuple[Path, Path, int]:
    """train.tsv and dev.tsv (``text_a<TAB>label`` = English<TAB>Chinese) and the training size."""
    with open(shared / CORPUS, encoding="utf-8") as f:
        pairs = [tuple(p.strip() for p in line.rstrip("\n").split("\t")) for line in f]
    pairs = [p for p in pairs if len(p) == 2 and all(p)]
    out.mkdir(parents=True, exist_ok=True)
    parts = {"train": [p for i, p in enumerate(pairs) if i % DEV_EVERY],
             "dev": [p for i, p in enumerate(pairs) if not i % DEV_EVERY]}
    for name, rows in parts.items():
        (out / f"{name}.tsv").write_text("text_a\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in rows),
                                         encoding="utf-8")
    return out / "train.tsv", out / "dev.tsv", len(parts["train"])


def vocabulary(train: Path, out: Path, size: int) -> Path:
    """A lower-cased WordPiece vocabulary of about ``size`` entries learnt from both sides of ``train``."""
    from pentad.data.vocab_builder import build_vocab

    text = out / "vocab-corpus.txt"
    rows = train.read_text(encoding="utf-8").splitlines()[1:]
    text.write_text("\n".join(part for row in rows for part in row.split("\t")) + "\n", encoding="utf-8")
    if not (out / "vocab" / "vocab.txt").is_file():
        build_vocab([text], "wordpiece", size, out / "vocab", lowercase=True, min_frequency=2, show_progress=False)
    return out / "vocab" / "vocab.txt"


def untrained_bleu(run_dir: Path, dev: Path) -> float:
    """Dev BLEU of the run's model with fresh weights (seeded as the run was), by the same task code."""
    import torch

    from pentad.builder import build_model
    from pentad.registry import TASKS
    from pentad.runs import load_run
    from pentad.tasks.runner import read_task_state

    cfg, tokenizer = load_run(run_dir)
    seq_length = min(cfg.data.objective.seq_length, cfg.model.max_seq_length)
    task = TASKS.get("text2text")(cfg.task, tokenizer, seq_length, read_task_state(run_dir))
    task.bind(cfg)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, provided=task.provides, training=False)
    data = task.read(dev)
    return task.evaluate(model, data, task.gold(data), 32, torch.device("cpu"))["bleu"]


def run(out_dir: Path, shared: Path, quick: bool) -> dict:
    data = out_dir / "news_commentary"
    train, dev, n = split(shared, data)
    vocab = vocabulary(train, data, 6000)
    hidden, layers, epochs = (64, 1, 2) if quick else (128, 2, 8)
    run_dir = out_dir / "text2text"
    results, seconds = finetune("text2text", run_dir, [
        "--config", "t5/small", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
        f"model.hidden_size={hidden}", f"model.encoder.num_layers={layers}", f"model.decoder.num_layers={layers}",
        f"model.encoder.num_heads={max(hidden // 64, 1)}", f"model.decoder.num_heads={max(hidden // 64, 1)}",
        f"model.encoder.ffn_size={4 * hidden}", f"model.decoder.ffn_size={4 * hidden}", "model.max_seq_length=128",
        "data.objective.seq_length=96", "task.target_seq_length=64", f"train.epochs={epochs}",
        "train.batch_size=32", "train.lr=3e-3", "train.threads=2", "train.progress=false",
        f"data.train={train}", f"data.dev={dev}"])
    return {"task": "text2text", "dataset": "news-commentary en-zh sample (dev, every 20th pair)",
            "metric": "bleu (sacrebleu, zh)", "score": results["dev"]["bleu"],
            "baseline_name": "the same model untrained", "baseline": untrained_bleu(run_dir, dev),
            "seconds": seconds, "train_examples": n}
