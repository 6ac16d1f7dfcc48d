"""NER on real Chinese data: MSRA NER through ``pentad finetune --task ner``, with and without
pre-training, in one run.

Steps (every one an ordinary pentad command, run in-process):

1. pre-train a small BERT (``bert/mini`` shrunk to ``--layers`` / ``--hidden``) with the ``bert``
   objective (MLM + NSP) on TencentPretrain's sampled CLUECorpusSmall, Google's Chinese WordPiece
   vocabulary, for ``--pretrain-steps`` steps;
2. fine-tune ``--task ner`` from that checkpoint, and, as the reference in the same run, the same
   model from random initialisation with the same budget;
3. print dev entity F1 / precision / recall and character accuracy for both, the all-'O' baseline
   (entity F1 0) and the gain.

MSRA NER in TencentPretrain's datasets folder has no train split here (dev 2,318 and test 4,636
sentences): the script trains on ``test.tsv`` and evaluates on ``dev.tsv``, which are disjoint
(scores are therefore not comparable with published MSRA test-set numbers). The data is the
shared TencentPretrain folder beside the repository (tests and benchmarks only).

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/ner_msra.py                 # about 10-15 minutes on 2 cores
    PYTHONPATH=src .venv/bin/python bench/ner_msra.py --pretrain-steps 100 --epochs 1 --train-rows 500  # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP = ROOT.parent / "shared" / "data" / "tencentpretrain"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--train-rows", type=int, default=0, help="use only the first N training sentences (0: all)")
    parser.add_argument("--lr", type=float, default=5e-4, help="fine-tuning learning rate (both runs)")
    parser.add_argument("--pretrained", type=Path, help="a pre-training run directory of this script to reuse "
                        "(skips steps 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    ner, vocab = TP / "datasets" / "msra_ner", TP / "models" / "google_zh_vocab.txt"
    corpus = TP / "corpora" / "CLUECorpusSmall_bert_sampled.txt"
    missing = [p for p in (ner / "test.tsv", ner / "dev.tsv", ner / "label2id.json", vocab, corpus) if not p.exists()]
    if missing:
        print(f"missing shared data ({', '.join(map(str, missing))}): this benchmark needs ../shared/data "
              "beside the repository", file=sys.stderr)
        return 2

    from pentad.cli.main import main as pentad

    work = args.output or Path(tempfile.mkdtemp(prefix="ner_msra_"))
    work.mkdir(parents=True, exist_ok=True)
    train = ner / "test.tsv"
    if args.train_rows:
        lines = train.read_text(encoding="utf-8").splitlines()
        train = work / "train.tsv"
        train.write_text("\n".join(lines[:args.train_rows + 1]) + "\n", encoding="utf-8")
    model = ["--config", "bert/mini", "tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}",
             f"model.hidden_size={args.hidden}", f"model.encoder.num_layers={args.layers}",
             f"model.encoder.num_heads={max(1, args.hidden // 64)}", f"model.encoder.ffn_size={4 * args.hidden}",
             f"data.objective.seq_length={args.seq_length}", f"train.threads={args.threads}", "train.progress=false"]
    timings: dict[str, float] = {}
    start = time.perf_counter()
    pretrained = args.pretrained or work / "pretrain"
    if args.pretrained is None:
        assert pentad(["preprocess", *model, f"data.corpus={corpus}", f"data.output={work / 'dataset'}"]) == 0
        assert pentad(["pretrain", *model, f"data.dataset={work / 'dataset'}", f"output={pretrained}",
                       f"train.steps={args.pretrain_steps}", "train.lr=5e-4", "train.log_every=100"]) == 0
    timings["pretrain"] = time.perf_counter() - start
    results = {}
    for name, init in (("pre-trained", [f"init={pretrained}"]), ("random init", [])):
        start = time.perf_counter()
        assert pentad(["finetune", "--task", "ner", *model, *init, f"data.train={train}", f"data.dev={ner / 'dev.tsv'}",
                       f"output={work / name.replace(' ', '_')}", f"task.labels_file={ner / 'label2id.json'}",
                       f"train.epochs={args.epochs}", "train.batch_size=32", f"train.lr={args.lr}",
                       "train.log_every=50"]) == 0
        timings[name] = time.perf_counter() - start
        results[name] = json.loads((work / name.replace(" ", "_") / "results.json").read_text())["dev"]
    rows = sum(1 for _ in open(train, encoding="utf-8")) - 1
    print(f"\nMSRA NER: train {rows:,} sentences (test.tsv), dev 2,318 (dev.tsv); BERT L={args.layers} "
          f"H={args.hidden}, seq_length {args.seq_length}; pre-training {args.pretrain_steps} steps "
          f"({timings['pretrain'] / 60:.1f} min), fine-tuning {args.epochs} epochs at lr {args.lr}")
    print("| model | dev entity F1 | precision | recall | char accuracy | fine-tune min |")
    print("|---|---:|---:|---:|---:|---:|")
    print("| all 'O' (baseline) | 0.000 | 0.000 | 0.000 | — | — |")
    for name, r in results.items():
        print(f"| {name} | {r['f1']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} | {r['accuracy']:.3f} | "
              f"{timings[name] / 60:.1f} |")
    gain = results["pre-trained"]["f1"] - results["random init"]["f1"]
    print(f"pre-training adds {gain:+.3f} entity F1")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "seconds": timings}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
