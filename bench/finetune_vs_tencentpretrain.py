"""Classification fine-tuning, pentad beside TencentPretrain's ``finetune/run_classifier.py``, from the
same weights, with the same hyper-parameters and data, over several seeds.

Steps:

1. the pre-trained model: a pentad pre-training run directory (``--pretrained``), or one built here
   as in the README quickstart (``--pretrain-steps`` of masked-LM on the book_review training text,
   TencentPretrain's ``bert/base_config.json`` shrunk to ``--layers`` / ``--hidden``);
2. ``pentad convert pentad-to-tencentpretrain`` of it: TencentPretrain's ``model.bin`` + JSON config;
3. book_review (TencentPretrain's Chinese sentiment set, ``label<TAB>text_a``) subsampled with a
   fixed seed to ``--train-rows`` / ``--eval-rows`` (dev and test);
4. per seed: TencentPretrain's ``run_classifier.py`` (from the checkout given by ``--tencentpretrain``;
   nothing of it is part of pentad) and ``pentad finetune --task classification`` — one run per
   ``--variant`` (a label and pentad overrides; default: pentad's defaults) — each a subprocess on
   ``--threads`` threads, timed;
5. a table of dev accuracy after each epoch and test accuracy (of the best-on-dev model, as both
   programs pick it), mean, standard deviation and range over the seeds, and seconds per run.

TencentPretrain needs ``six`` beside torch: ``--tp-python`` (default: this interpreter) with
``PYTHONPATH`` extended by ``--tp-pythonpath``. Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/finetune_vs_tencentpretrain.py --tencentpretrain /path/to/TencentPretrain \\
        --pretrained runs/book_review_pretrain --seeds 1 2 3 --pooling mean \\
        --variant default= --variant corrected=train.adam_bias_correction=true

(``--jobs 3`` runs three at a time: faster on a multi-core machine, but then the seconds are not a
speed comparison.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP_DATA = ROOT.parent / "shared" / "data" / "tencentpretrain"
SMALL = ["model.encoder.num_layers={layers}", "model.hidden_size={hidden}", "model.encoder.num_heads={heads}",
         "model.encoder.ffn_size={ffn}"]


def pentad_cmd() -> list[str]:
    return [sys.executable, "-m", "pentad"]


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Run ``cmd`` with output to ``log``; seconds taken. A failure prints the log's tail and exits."""
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    seconds = time.perf_counter() - start
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        sys.exit(f"command failed ({code}): {' '.join(cmd)}\n{tail}")
    return seconds


def subsample(data: Path, out: Path, train_rows: int, eval_rows: int) -> dict[str, int]:
    sizes = {}
    for name, n in (("train", train_rows), ("dev", eval_rows), ("test", eval_rows)):
        lines = (data / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
        header, rows = lines[0], lines[1:]
        random.Random(0).shuffle(rows)
        rows = rows[:n] if n else rows
        (out / f"{name}.tsv").write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
        sizes[name] = len(rows)
    return sizes


def pretrain(args, work: Path, small: list[str], env: dict[str, str]) -> Path:
    config = ["--config", str(TP_DATA / "configs" / "bert" / "base_config.json"),
              f"vocab_path={TP_DATA / 'models' / 'google_zh_vocab.txt'}"]
    corpus = work / "corpus.txt"
    lines = (args.data / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    corpus.write_text("\n".join(line.split("\t", 1)[1] for line in lines) + "\n", encoding="utf-8")
    run(pentad_cmd() + ["preprocess"] + config + small + [
        "data.objective=mlm", f"data.objective.seq_length={args.seq_length}", f"data.corpus={corpus}",
        f"data.output={work / 'pretrain_ds'}", "data.workers=1"], work / "preprocess.log", env)
    out = work / "pretrain"
    seconds = run(pentad_cmd() + ["pretrain"] + config + small + [
        "data.objective=mlm", "model.targets=[mlm]", f"data.dataset={work / 'pretrain_ds'}", f"output={out}",
        f"train.steps={args.pretrain_steps}", "train.batch_size=32", f"train.threads={args.threads}",
        "train.progress=false"], work / "pretrain.log", env)
    print(f"pre-trained {args.pretrain_steps} steps in {seconds:.0f} s: {out}", file=sys.stderr)
    return out


def tencentpretrain_run(args, work: Path, model: Path, seed: int) -> dict:
    out = work / f"tp_seed{seed}"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join([str(args.tencentpretrain)] + ([args.tp_pythonpath] if args.tp_pythonpath
                                                                          else []))
    cmd = [args.tp_python, str(args.tencentpretrain / "finetune" / "run_classifier.py"),
           "--pretrained_model_path", str(model / "model.bin"), "--config_path", str(model / "config.json"),
           "--vocab_path", str(TP_DATA / "models" / "google_zh_vocab.txt"),
           "--train_path", str(work / "train.tsv"), "--dev_path", str(work / "dev.tsv"),
           "--test_path", str(work / "test.tsv"), "--output_model_path", str(out / "classifier.bin"),
           "--epochs_num", str(args.epochs), "--batch_size", str(args.batch_size),
           "--learning_rate", str(args.lr), "--seq_length", str(args.seq_length), "--seed", str(seed),
           "--pooling", args.pooling]
    seconds = run(cmd, out / "log.txt", env, cwd=args.tencentpretrain)
    accuracies = [float(a) for a in re.findall(r"Acc\. \(Correct/Total\): ([0-9.]+)",
                                                 (out / "log.txt").read_text(encoding="utf-8"))]
    return {"dev": accuracies[:-1], "test": accuracies[-1], "seconds": seconds}


def pentad_run(args, work: Path, pretrained: Path, seed: int, label: str, overrides: list[str],
               env: dict[str, str]) -> dict:
    out = work / f"pentad_{label}_seed{seed}"
    cmd = pentad_cmd() + ["finetune", "--task", "classification", "--config", str(pretrained / "config.yaml"),
                          f"init={pretrained}", "data.objective=cls", f"data.objective.seq_length={args.seq_length}",
                          f"data.train={work / 'train.tsv'}", f"data.dev={work / 'dev.tsv'}",
                          f"data.test={work / 'test.tsv'}", f"output={out}", f"train.epochs={args.epochs}",
                          f"train.batch_size={args.batch_size}", f"train.lr={args.lr}", f"train.seed={seed}",
                          f"train.threads={args.threads}", "train.progress=false", f"task.pooling={args.pooling}"
                          ] + overrides
    seconds = run(cmd, work / f"pentad_{label}_seed{seed}.log", env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    dev = [r["dev_accuracy"] for r in records if "dev_accuracy" in r]
    results = json.loads((out / "results.json").read_text())
    return {"dev": dev, "test": results["test"]["accuracy"], "seconds": seconds}


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return (f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} "
            f"({min(values):.3f}–{max(values):.3f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tencentpretrain", type=Path, required=True, help="a TencentPretrain checkout")
    parser.add_argument("--tp-python", default=sys.executable, help="the Python that runs TencentPretrain")
    parser.add_argument("--tp-pythonpath", default="", help="extra PYTHONPATH for TencentPretrain (e.g. for six)")
    parser.add_argument("--pretrained", type=Path, help="a pentad pre-training run directory (default: build one)")
    parser.add_argument("--pretrain-steps", type=int, default=500)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--data", type=Path, default=TP_DATA / "datasets" / "book_review")
    parser.add_argument("--train-rows", type=int, default=3000, help="0: all")
    parser.add_argument("--eval-rows", type=int, default=1000, help="dev and test rows each; 0: all")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--pooling", choices=["first", "mean", "max", "last"], default="first",
                        help="sequence pooling of both heads (TencentPretrain's --pooling, pentad's task.pooling)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=OVERRIDE[,OVERRIDE...]",
                        help="a pentad run per seed with these overrides (repeatable; default: 'default=')")
    parser.add_argument("--skip-tencentpretrain", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (timings are comparable only with 1)")
    parser.add_argument("--output", type=Path, required=True, help="working directory (runs, logs, results.json)")
    args = parser.parse_args()
    if not (args.tencentpretrain / "finetune" / "run_classifier.py").is_file():
        print(f"{args.tencentpretrain} is not a TencentPretrain checkout (no finetune/run_classifier.py)",
              file=sys.stderr)
        return 2
    work = args.output.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    heads = max(1, args.hidden // 64)
    small = [s.format(layers=args.layers, hidden=args.hidden, heads=heads, ffn=4 * args.hidden) for s in SMALL]
    pretrained = args.pretrained.resolve() if args.pretrained else pretrain(args, work, small, env)
    tp_model = work / "tencentpretrain_model"
    if not (tp_model / "model.bin").is_file():
        run(pentad_cmd() + ["convert", "pentad-to-tencentpretrain", str(pretrained), str(tp_model)],
            work / "convert.log", env)
    sizes = subsample(args.data, work, args.train_rows, args.eval_rows)
    variants = [(v.split("=", 1)[0], [o for o in v.split("=", 1)[1].split(",") if o]) for v in
                (args.variant or ["default="])]
    jobs = []
    for seed in args.seeds:
        if not args.skip_tencentpretrain:
            jobs.append(("TencentPretrain", seed, lambda seed=seed: tencentpretrain_run(args, work, tp_model, seed)))
        for label, overrides in variants:
            jobs.append((f"pentad {label}", seed, lambda seed=seed, label=label, overrides=overrides:
                         pentad_run(args, work, pretrained, seed, label, overrides, env)))
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in jobs}
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(job): (name, seed) for name, seed, job in jobs}
        for future in as_completed(futures):
            name, seed = futures[future]
            result = dict(future.result(), seed=seed)
            rows[name].append(result)
            print(f"seed {seed} {name}: {result}", file=sys.stderr)
    print(f"book_review train/dev/test {sizes['train']}/{sizes['dev']}/{sizes['test']}, {args.epochs} epochs, "
          f"batch {args.batch_size}, lr {args.lr}, seq {args.seq_length}, {args.pooling} pooling, seeds {args.seeds}, "
          f"{args.threads} thread(s)")
    print("| run | " + " | ".join(f"dev epoch {e + 1}" for e in range(args.epochs)) + " | test | seconds |")
    print("|---" * (args.epochs + 3) + "|")
    for name, runs in rows.items():
        devs = [summary([r["dev"][e] for r in runs]) for e in range(args.epochs)]
        print(f"| {name} | " + " | ".join(devs) + f" | {summary([r['test'] for r in runs])} | "
              f"{statistics.mean(r['seconds'] for r in runs):.0f} |")
    (work / "results.json").write_text(json.dumps({"sizes": sizes, "args": {k: str(v) for k, v in vars(args).items()},
                                                   "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
