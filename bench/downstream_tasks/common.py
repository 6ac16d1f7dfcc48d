"""What the rows of ``bench/downstream.py`` share: the pentad CLI in-process, a small Chinese BERT
pre-trained once per benchmark run, TSV slicing and simple baselines."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

ZH_VOCAB = "models/google_zh_vocab.txt"
ZH_CORPUS = "corpora/CLUECorpusSmall_bert_sampled.txt"


def pentad(*argv: str) -> None:
    """Run one pentad command in this process; a failure stops the benchmark with its exit code."""
    from pentad.cli.main import main

    code = main(list(argv))
    if code != 0:
        raise SystemExit(f"pentad {' '.join(argv[:2])} failed with exit code {code}")


def small_bert(shared: Path, quick: bool, threads: int = 2) -> list[str]:
    """Config arguments of the small Chinese BERT every row fine-tunes (L=2/H=128 quick, L=4/H=256 otherwise)."""
    hidden, layers = (128, 2) if quick else (256, 4)
    return ["--config", "bert/mini", "tokenizer.type=wordpiece", f"tokenizer.vocab={shared / ZH_VOCAB}",
            f"model.hidden_size={hidden}", f"model.encoder.num_layers={layers}",
            f"model.encoder.num_heads={hidden // 64}", f"model.encoder.ffn_size={4 * hidden}",
            "data.objective.seq_length=128", f"train.threads={threads}", "train.progress=false"]


def pretrained_bert(out_dir: Path, shared: Path, quick: bool) -> Path:
    """A small Chinese BERT pre-trained (MLM + NSP) on the sampled CLUECorpusSmall, once per output
    directory (reused by every row that asks; 60 steps quick, 600 otherwise)."""
    run = out_dir / "pretrained-bert"
    if (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir()):
        return run
    model = small_bert(shared, quick)
    dataset = out_dir / "pretrain-dataset"
    if not dataset.is_dir():
        pentad("preprocess", *model, f"data.corpus={shared / ZH_CORPUS}", f"data.output={dataset}")
    pentad("pretrain", *model, f"data.dataset={dataset}", f"output={run}", f"train.steps={60 if quick else 600}",
           "train.lr=5e-4", "train.log_every=50")
    return run


def head_tsv(source: Path, out: Path, rows: int) -> Path:
    """The header and the first ``rows`` data lines of a TSV (all of it when ``rows`` is 0)."""
    lines = source.read_text(encoding="utf-8").splitlines()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines[:rows + 1] if rows else lines) + "\n", encoding="utf-8")
    return out


def majority_accuracy(train: Path, dev: Path, column: str = "label") -> float:
    """Accuracy on ``dev`` of always predicting the most frequent training label."""
    def labels(path: Path) -> list[str]:
        lines = path.read_text(encoding="utf-8").splitlines()
        index = lines[0].split("\t").index(column)
        return [line.split("\t")[index] for line in lines[1:] if line]

    top = Counter(labels(train)).most_common(1)[0][0]
    gold = labels(dev)
    return sum(g == top for g in gold) / len(gold)


def finetune(task: str, run: Path, args: list[str]) -> tuple[dict[str, Any], float]:
    """(results.json of a ``pentad finetune --task TASK`` run, seconds)."""
    start = time.perf_counter()
    pentad("finetune", "--task", task, *args, f"output={run}")
    return json.loads((run / "results.json").read_text(encoding="utf-8")), time.perf_counter() - start
