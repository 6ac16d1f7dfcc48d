"""``pentad compress`` on book_review sentiment: accuracy, size and CPU speed of each step.

A teacher classifier (a BERT of 4 layers, width 256, 4 heads, feed-forward 1024, mean pooling, fine-tuned
on a slice of book_review's training set from random weights: no pre-trained Chinese model of this size is
at hand, and pre-training one would take most of the time budget; characters as tokens, the vocabulary
the characters seen twice in the first 8,000 training reviews) is compressed with one command::

    pentad compress TEACHER --output SMALL --distill layers=2 --prune heads=0.3,ffn=0.3 --quantize int8

and every intermediate model is measured on the same held-out test slice (book_review's test.tsv):

* ``teacher``: the fine-tuned run (fp32);
* ``distilled``: the 2-layer student (initialised from teacher layers 1 and 3, trained on the teacher's
  logits, hidden states and attention beside the labels);
* ``distilled + int8``: the student quantized (``pentad compress STUDENT --quantize int8``);
* ``distilled + pruned``: 30% of heads and feed-forward units removed, one epoch of recovery fine-tuning;
* ``distilled + pruned + int8``: the command's final model.

Accuracy comes from ``pentad infer`` on the test slice; size is ``model.safetensors``; latency is the time
of one review (batch 1, 64 tokens) and throughput reviews per second at batch 32 (64 tokens), on
``--threads`` CPU threads (default 1), in this process. Each timing is the fastest of ``--repeats``
rounds, the models interleaved within a round: on a machine shared with other jobs a round is slowed at
random, the fastest is the model's own speed. The targets of the issue: at least 3x faster on the CPU than
the teacher with at most 1.5 points of accuracy lost. Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/compress.py --quick    # a smoke run, ~3 min
    PYTHONPATH=src .venv/bin/python bench/compress.py            # the table in bench/RESULTS.md (~12 min)
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "tencentpretrain"
sys.path.insert(0, str(ROOT))


def pentad(*argv: str) -> None:
    from pentad.cli.main import main

    code = main([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"pentad {' '.join(map(str, argv[:2]))} failed with exit code {code}")


def head_tsv(source: Path, out: Path, rows: int) -> Path:
    lines = source.read_text(encoding="utf-8").splitlines()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines[:rows + 1]) + "\n", encoding="utf-8")
    return out


def accuracy(run: Path, test: Path, out: Path) -> float:
    predictions = out / f"{run.name}.predictions.tsv"
    pentad("infer", "--model", run, f"data.test={test}", "--output", predictions, "--overwrite")
    gold = [line.split("\t")[0] for line in test.read_text(encoding="utf-8").splitlines()[1:] if line]
    rows = predictions.read_text(encoding="utf-8").splitlines()
    column = rows[0].split("\t").index("label")
    predicted = [r.split("\t")[column] for r in rows[1:] if r]
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


def batches(run: Path, test: Path, seq: int, sizes: tuple[int, ...]) -> dict[int, object]:
    """Batches of the test reviews, padded or cut to ``seq`` tokens, of each size."""
    from pentad.registry import TASKS
    from pentad.runs import load_run
    from pentad.tasks.runner import read_task_state

    cfg, tokenizer = load_run(run)
    task = TASKS.get(cfg.task.type)(cfg.task, tokenizer, seq, read_task_state(run))
    task.bind(cfg)
    instances = task.read(test, with_labels=False)
    found = {}
    for size in sizes:
        batch = task.collate(instances, np.arange(size) % len(instances), np.random.default_rng(0))
        tokens = batch.tokens
        if tokens.shape[1] < seq:  # every row as long as the longest: pad the batch out to seq
            pad = torch.zeros(tokens.shape[0], seq - tokens.shape[1], dtype=tokens.dtype)
            tokens = torch.cat([tokens, pad + 100], dim=1)
        batch.tokens = tokens[:, :seq]
        batch.segments = torch.zeros_like(batch.tokens)
        batch.padding_mask = torch.zeros_like(batch.tokens, dtype=torch.bool)
        found[size] = batch
    return found


def timings(runs: dict[str, Path], test: Path, seq: int, repeats: int, threads: int) -> dict[str, dict[str, float]]:
    from pentad.compression.store import load_run_model

    torch.set_num_threads(threads)
    models = {name: load_run_model(run)[0] for name, run in runs.items()}
    inputs = batches(next(iter(runs.values())), test, seq, (1, 32))
    best: dict[str, dict[str, float]] = {name: {"latency_ms": float("inf"), "throughput": 0.0} for name in runs}
    with torch.inference_mode():
        for model in models.values():  # warm-up (int8 weights are packed on the first call)
            model(inputs[1])
            model(inputs[32])
        for r in range(repeats):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                model = models[name]
                start = time.perf_counter()
                for _ in range(20):
                    model(inputs[1])
                latency = (time.perf_counter() - start) / 20 * 1000
                start = time.perf_counter()
                for _ in range(3):
                    model(inputs[32])
                throughput = 3 * 32 / (time.perf_counter() - start)
                best[name]["latency_ms"] = min(best[name]["latency_ms"], latency)
                best[name]["throughput"] = max(best[name]["throughput"], throughput)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller slices and fewer epochs (a smoke run)")
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the timings (default 1)")
    parser.add_argument("--train-threads", type=int, default=1, help="CPU threads for fine-tuning (default 1: on a "
                        "shared machine more threads than free cores slow every step)")
    parser.add_argument("--repeats", type=int, default=5, help="timing rounds; the fastest counts")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    if not SHARED.is_dir():
        print(f"missing shared data ({SHARED}): this benchmark needs ../shared/data beside the repository",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    out = args.output or Path(tempfile.mkdtemp(prefix="compress_"))
    out.mkdir(parents=True, exist_ok=True)
    book = SHARED / "datasets" / "book_review"
    rows = (2000, 300, 500) if args.quick else (4000, 800, 2000)
    train = head_tsv(book / "train.tsv", out / "data" / "train.tsv", rows[0])
    dev = head_tsv(book / "dev.tsv", out / "data" / "dev.tsv", rows[1])
    test = head_tsv(book / "test.tsv", out / "data" / "test.tsv", rows[2])
    seq = 64
    vocab = out / "data" / "vocab.txt"
    counts = Counter(ch for line in (book / "train.tsv").read_text(encoding="utf-8").splitlines()[1:8001]
                     for ch in line.split("\t", 1)[-1] if not ch.isspace())
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [ch for ch, n in counts.most_common() if n >= 2]) + "\n", encoding="utf-8")
    common = [f"train.threads={args.train_threads}", "train.progress=false", "train.log_every=50"]
    teacher, small, student_int8 = out / "teacher", out / "small", out / "distilled-int8"
    epochs = 2 if args.quick else 3
    if not (teacher / "results.json").is_file():
        pentad("finetune", "--task", "classification", "--config", "bert/mini", "tokenizer.type=char",
               f"tokenizer.vocab={vocab}", "model.hidden_size=256",
               "model.encoder.num_layers=4", "model.encoder.num_heads=4", "model.encoder.ffn_size=1024",
               f"model.max_seq_length={seq}", f"data.objective.seq_length={seq}", "task.pooling=mean",
               f"data.train={train}", f"data.dev={dev}", f"output={teacher}", f"train.epochs={epochs}",
               "train.batch_size=32", "train.lr=1e-3", "train.adam_bias_correction=true", *common)
    for path in (small, student_int8):
        if path.exists():
            shutil.rmtree(path)
    pentad("compress", teacher, "--out", small, "--distill", f"layers=2,epochs={epochs}",
           "--prune", "heads=0.3,ffn=0.3", "--recover-epochs", "1", "--quantize", "int8",
           *(x for item in common for x in ("--set", item)))
    steps = small / "steps"
    pentad("compress", steps / "distilled", "--out", student_int8, "--quantize", "int8")
    runs = {"teacher (L4 H256)": teacher, "distilled (L2)": steps / "distilled", "distilled + int8": student_int8,
            "distilled + pruned": steps / "recovered", "distilled + pruned + int8": small}
    results = {}
    for name, run in runs.items():
        weights = run / "model.safetensors" if (run / "model.safetensors").is_file() else run / "best" / \
            "model.safetensors"
        results[name] = {"accuracy": accuracy(run, test, out), "mb": weights.stat().st_size / 1e6}
    for name, timing in timings(runs, test, seq, args.repeats, args.threads).items():
        results[name].update(timing)
    base = results["teacher (L4 H256)"]
    final = results["distilled + pruned + int8"]
    speedup = base["latency_ms"] / final["latency_ms"]
    throughput_gain = final["throughput"] / base["throughput"]
    lost = (base["accuracy"] - final["accuracy"]) * 100
    lines = [f"book_review test slice ({rows[2]:,} reviews), {seq} tokens, {args.threads} thread(s); torch "
             f"{torch.__version__}, Python {platform.python_version()}, "
             f"{datetime.now(timezone.utc):%Y-%m-%d}; {time.perf_counter() - started:.0f} s in all",
             "", "| model | test accuracy | model.safetensors MB | latency ms (batch 1) | speed-up | "
             "reviews/s (batch 32) | speed-up |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['accuracy']:.3f} | {r['mb']:.2f} | {r['latency_ms']:.2f} | "
                     f"{base['latency_ms'] / r['latency_ms']:.2f}x | {r['throughput']:.0f} | "
                     f"{r['throughput'] / base['throughput']:.2f}x |")
    met = speedup >= 3.0 and throughput_gain >= 3.0 and lost <= 1.5
    lines += ["", f"targets (>= 3x faster, <= 1.5 points lost): latency {speedup:.2f}x, throughput "
              f"{throughput_gain:.2f}x, accuracy {-lost:+.1f} points: {'met' if met else 'NOT met'}"]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "speedup": speedup, "throughput_gain": throughput_gain,
                                         "points_lost": lost, "met": met}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
