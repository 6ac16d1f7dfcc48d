"""``pentad demo`` (``make demo``): pre-train a small BERT on real English text, then fine-tune it
on real movie-review sentiment, and compare with the majority class and with no pre-training.

Data arrives through PyPI at run time (nothing is committed): a Wikipedia excerpt inside the
gensim wheel and the Pang & Lee movie-review sentences inside the vaderSentiment sdist (see
``pentad.data.assets``). Every step is an ordinary pentad command run in-process.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from pentad.config.loader import load_config
from pentad.runs import info

RECIPE = "bert/mini"  # L=4, H=256, A=4


def _timed_steps(cfg: Any, minutes: float) -> int:
    """Steps that fit in ``minutes`` on this machine, from a short timed run of the same model."""
    from pentad.builder import build_model
    from pentad.data.loader import PretrainBatches, open_dataset
    from pentad.model import total_loss
    from pentad.registry import OBJECTIVES
    from pentad.runs import complete_vocab, load_tokenizer
    from pentad.training.optim import build_optimizer

    tokenizer = load_tokenizer(cfg)
    complete_vocab(cfg, tokenizer)
    objective = OBJECTIVES.get(cfg.data.objective.type)(cfg.data.objective, tokenizer)
    dataset = open_dataset(cfg.data.dataset, tokenizer, objective)
    model = build_model(cfg.model, provided=objective.provides)
    optimizer = build_optimizer(model, cfg.train)
    batches = PretrainBatches(dataset, objective, cfg.train.batch_size, cfg.train.seed).iterate(0)
    times = []
    for _ in range(6):
        batch = next(batches)
        start = time.perf_counter()
        total_loss(model(batch)).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    per_step = sorted(times[1:])[len(times[1:]) // 2] * 1.1  # median, plus 10% for logging and data
    return max(20, int(minutes * 60 / per_step))


def run_demo(output: Path, minutes: float = 4.0, quick: bool = False) -> dict[str, Any]:
    from pentad.data.assets import default_cache_dir, ensure_mr_sentiment, ensure_wikipedia_corpus
    from pentad.data.vocab_builder import build_vocab
    from pentad.runs import preprocess_from_config
    from pentad.tasks.runner import finetune
    from pentad.training.pretrain import pretrain

    started = time.perf_counter()
    output.mkdir(parents=True, exist_ok=True)
    for old in ("pretrain", "finetune-pretrained", "finetune-from"):  # runs of an earlier demo start afresh
        shutil.rmtree(output / old, ignore_errors=True)
    cache = default_cache_dir()
    info("== 1/5 data: Wikipedia excerpt (gensim wheel) and movie-review sentiment (vaderSentiment sdist)")
    wiki = ensure_wikipedia_corpus(cache)
    mr = ensure_mr_sentiment(cache)
    info(f"corpus: {wiki.articles} articles, {wiki.sentences:,} sentences, {wiki.words:,} words; "
         f"sentiment: {mr.counts}")

    info("== 2/5 vocabulary: WordPiece trained on the corpus")
    vocab_dir = output / "vocab"
    if not (vocab_dir / "vocab.txt").is_file():
        build_vocab([wiki.docs_path], "wordpiece", 8000, vocab_dir, lowercase=True, min_frequency=2)
    tok = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab_dir / 'vocab.txt'}", "tokenizer.lowercase=true"]

    info("== 3/5 preprocess: sentence pairs for masked LM + next-sentence prediction")
    dataset = output / "dataset"
    # Short sequences: the corpus is small and the movie reviews are single sentences (about 30 tokens).
    common = [*tok, "data.objective.seq_length=64", "model.max_seq_length=64"]
    if not (dataset / "manifest.json").is_file():
        preprocess_from_config(load_config(RECIPE, [*common, f"data.corpus={wiki.sentences_path}",
                                                    f"data.output={dataset}", "data.workers=2"]))

    info(f"== 4/5 pre-train {RECIPE} for about {minutes:g} minutes")
    pre_cfg = load_config(RECIPE, [*common, f"data.dataset={dataset}", f"output={output / 'pretrain'}",
                                   "train.batch_size=64", "train.lr=5.0e-4", "train.warmup=0.1",
                                   "train.log_every=20"])
    steps = 30 if quick else _timed_steps(pre_cfg, minutes)
    pre_cfg.train.steps = steps
    pre_cfg.train.save_every = max(50, steps // 4)
    pretrain(pre_cfg)

    info("== 5/5 fine-tune on movie-review sentiment, with and without pre-training")
    train_tsv = mr.train
    if quick:  # a slice of the training set, for smoke tests
        train_tsv = output / "train-quick.tsv"
        train_tsv.write_text("".join(mr.train.read_text(encoding="utf-8").splitlines(True)[:801]), encoding="utf-8")
    results = {}
    for name, init in (("pretrained", output / "pretrain"), ("from scratch", None)):
        overrides = [*common, f"data.train={train_tsv}", f"data.dev={mr.dev}",
                     f"data.test={mr.test}", f"output={output / ('finetune-' + name.split()[0])}",
                     "task.type=classification", f"train.epochs={1 if quick else 2}", "train.batch_size=32",
                     "train.lr=5.0e-4", "train.warmup=0.1", "train.log_every=20"]
        if init is not None:
            overrides.append(f"init={init}")
        results[name] = finetune(load_config(RECIPE, overrides))
    majority = {split: mr.majority_share[split] for split in ("dev", "test")}
    summary = {"pretrain_steps": steps, "majority": majority,
               **{name: {s: r[s]["accuracy"] for s in ("dev", "test")} for name, r in results.items()},
               "minutes": round((time.perf_counter() - started) / 60, 1)}
    (output / "demo_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print()
    print(f"Movie-review sentiment (MR), accuracy  [{RECIPE}, {steps} pre-training steps, "
          f"{torch.get_num_threads()} threads]")
    print(f"  {'':26s} {'dev':>7s} {'test':>7s}")
    print(f"  {'majority class':26s} {majority['dev']:7.3f} {majority['test']:7.3f}")
    for name in ("from scratch", "pretrained"):
        print(f"  {'fine-tuned, ' + name:26s} {summary[name]['dev']:7.3f} {summary[name]['test']:7.3f}")
    print(f"  total time {summary['minutes']} min; runs in {output}")
    return summary
