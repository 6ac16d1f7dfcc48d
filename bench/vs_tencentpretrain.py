"""pentad's CLI against TencentPretrain's own ``preprocess.py`` / ``pretrain.py`` on CPU, end to end.

Both programs get TencentPretrain's own config files and its CLUE corpora from the shared data, as a
user of either would run them:

* **preprocess**: the corpus repeated to ``--corpus-mb`` megabytes, ``--workers`` processes, sequence
  length 128, for the ``bert`` (MLM + NSP, ``CLUECorpusSmall_bert_sampled.txt``) and ``lm`` (GPT-2,
  ``CLUECorpusSmall_sampled.txt``) processors: wall seconds, corpus bytes/s, the peak resident memory
  of the process tree and the size of the dataset written.
* **pretrain**: ``bert/tiny_config.json`` (the ``bert`` dataset) and ``gpt2/config.json`` shrunk to 4
  layers of width 128 (the ``lm`` dataset), batch ``--batch-size`` x 128, on ``--threads`` threads. A
  step's time is the difference of two runs' wall times over the difference of their step counts
  (``--steps A B``), so start-up (imports, model building, dataset loading) cancels; samples/s =
  batch / step time. Runs alternate between the two programs (``--repeats`` pairs; the median step
  time is reported) so that a background load hits both alike. ``--pentad-set KEY=VALUE`` adds an
  override to pentad's training runs (``train.precision=bf16`` on a CPU with bf16 matrix units).
  Every row records the 1-minute load average before and after its runs (``load_1min``): on a shared
  machine, read ratios with it.

Ratios are pentad / TencentPretrain for throughput (higher is better for pentad). TencentPretrain
runs from the checkout given by ``--tencentpretrain`` (nothing of it is part of pentad; it needs
``six`` beside torch: ``--tp-python`` / ``--tp-pythonpath``). Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/vs_tencentpretrain.py --tencentpretrain /path/to/TencentPretrain
    PYTHONPATH=src .venv/bin/python bench/vs_tencentpretrain.py --tencentpretrain TP --only pretrain --steps 10 40
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP_DATA = ROOT.parent / "shared" / "data" / "tencentpretrain"
VOCAB = TP_DATA / "models" / "google_zh_vocab.txt"
CORPORA = {"bert": "CLUECorpusSmall_bert_sampled.txt", "lm": "CLUECorpusSmall_sampled.txt"}
# workload -> (TencentPretrain config, changes to it, data processor)
WORKLOADS = {
    "bert": ("bert/tiny_config.json", {}, "bert"),
    "gpt2": ("gpt2/config.json", {"layers_num": 4, "hidden_size": 128, "emb_size": 128, "heads_num": 2,
                                  "feedforward_size": 512}, "lm"),
}


def run(cmd: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> tuple[float, float | None]:
    """Run ``cmd`` (output to ``log``); (wall seconds, peak resident MiB of its whole process tree,
    sampled every 50 ms; None without psutil). A failure prints the log's tail and exits."""
    try:
        import psutil
    except ImportError:
        psutil = None
    peak = 0
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        watched = psutil.Process(proc.pid) if psutil is not None else None
        while proc.poll() is None:
            if watched is not None:
                try:
                    tree = [watched, *watched.children(recursive=True)]
                    peak = max(peak, sum(p.memory_info().rss for p in tree))
                except psutil.Error:
                    pass
            time.sleep(0.05)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return seconds, (peak / 2**20 if psutil is not None else None)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Programs:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        threads = str(args.threads)
        self.env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        self.tp_env = dict(self.env, PYTHONPATH=os.pathsep.join(
            [str(args.tencentpretrain)] + ([args.tp_pythonpath] if args.tp_pythonpath else [])))
        self.pentad_env = dict(self.env, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))

    def tp_config(self, workload: str) -> Path:
        name, changes, _ = WORKLOADS[workload]
        config = json.loads((self.args.tencentpretrain / "models" / name).read_text(encoding="utf-8"))
        config.update(changes)
        path = self.work / f"{workload}_config.json"
        path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        return path

    # ------------------------------------------------------------------ preprocess
    def tp_preprocess(self, processor: str, corpus: Path, out: Path) -> tuple[float, float]:
        return run([self.args.tp_python, str(self.args.tencentpretrain / "preprocess.py"),
                    "--corpus_path", str(corpus), "--vocab_path", str(VOCAB), "--dataset_path", str(out),
                    "--processes_num", str(self.args.workers), "--data_processor", processor,
                    "--seq_length", "128"],
                   self.work / f"tp_preprocess_{processor}.log", self.tp_env, cwd=self.args.tencentpretrain)

    def pentad_preprocess(self, workload: str, corpus: Path, out: Path) -> tuple[float, float]:
        return run([sys.executable, "-m", "pentad", "preprocess", "--config", str(self.tp_config(workload)),
                    f"vocab_path={VOCAB}", f"data.corpus={corpus}", f"data.output={out}",
                    f"data.workers={self.args.workers}", "data.objective.seq_length=128"],
                   self.work / f"pentad_preprocess_{workload}.log", self.pentad_env)

    # ------------------------------------------------------------------ pretrain
    def tp_pretrain(self, workload: str, dataset: Path, steps: int) -> float:
        out = self.work / f"tp_{workload}_{steps}"
        out.mkdir(exist_ok=True)
        seconds, _ = run([self.args.tp_python, str(self.args.tencentpretrain / "pretrain.py"),
                          "--dataset_path", str(dataset), "--vocab_path", str(VOCAB),
                          "--config_path", str(self.tp_config(workload)), "--output_model_path",
                          str(out / "model.bin"), "--total_steps", str(steps), "--batch_size",
                          str(self.args.batch_size), "--report_steps", str(max(1, steps // 2)),
                          "--save_checkpoint_steps", str(10 * steps)],
                         out / "log.txt", self.tp_env, cwd=self.args.tencentpretrain)
        return seconds

    def pentad_pretrain(self, workload: str, dataset: Path, steps: int) -> float:
        out = self.work / f"pentad_{workload}_{steps}"
        if out.exists():
            shutil.rmtree(out)
        seconds, _ = run([sys.executable, "-m", "pentad", "pretrain", "--config", str(self.tp_config(workload)),
                          f"vocab_path={VOCAB}", f"data.dataset={dataset}", f"output={out}",
                          "data.objective.seq_length=128",
                          f"train.steps={steps}", f"train.batch_size={self.args.batch_size}",
                          f"train.threads={self.args.threads}", "train.progress=false",
                          f"train.log_every={max(1, steps // 2)}", "train.tensorboard=false",
                          *self.args.pentad_set],
                         self.work / f"pentad_{workload}_{steps}.log", self.pentad_env)
        return seconds


def repeated_corpus(source: Path, out: Path, megabytes: float) -> Path:
    """``source`` repeated to about ``megabytes`` MB (whole copies, documents kept apart by a blank line)."""
    text = source.read_text(encoding="utf-8")
    if not text.endswith("\n\n"):
        text = text.rstrip("\n") + "\n\n"
    copies = max(1, round(megabytes * 1e6 / len(text.encode("utf-8"))))
    out.write_text(text * copies, encoding="utf-8")
    return out


def bench_preprocess(p: Programs, args: argparse.Namespace) -> list[dict]:
    rows = []
    for workload, (_, _, processor) in WORKLOADS.items():
        if workload not in args.workloads:
            continue
        corpus = repeated_corpus(TP_DATA / "corpora" / CORPORA[processor], p.work / f"corpus_{processor}.txt",
                                 args.corpus_mb)
        size = corpus.stat().st_size
        load_before = os.getloadavg()[0]
        tp_out, pentad_out = p.work / f"tp_{processor}.pt", p.work / f"pentad_{processor}"
        if pentad_out.exists():  # an earlier run with the same --work (pentad never overwrites a dataset)
            shutil.rmtree(pentad_out)
        tp_s, tp_mem = p.tp_preprocess(processor, corpus, tp_out)
        pentad_s, pentad_mem = p.pentad_preprocess(workload, corpus, pentad_out)
        row = {"processor": processor, "corpus_mb": round(size / 1e6, 1), "workers": args.workers,
               "tp_s": round(tp_s, 1), "pentad_s": round(pentad_s, 1),
               "tp_mb_per_s": round(size / 1e6 / tp_s, 2), "pentad_mb_per_s": round(size / 1e6 / pentad_s, 2),
               "ratio": round(tp_s / pentad_s, 2), "tp_peak_mib": tp_mem and round(tp_mem),
               "pentad_peak_mib": pentad_mem and round(pentad_mem),
               "tp_dataset_mb": round(size_of(tp_out) / 1e6, 1),
               "pentad_dataset_mb": round(size_of(pentad_out) / 1e6, 1),
               "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


def bench_pretrain(p: Programs, args: argparse.Namespace) -> list[dict]:
    rows = []
    low, high = args.steps
    for workload, (_, _, processor) in WORKLOADS.items():
        if workload not in args.workloads:
            continue
        corpus = repeated_corpus(TP_DATA / "corpora" / CORPORA[processor], p.work / f"train_corpus_{processor}.txt",
                                 1)
        tp_ds, pentad_ds = p.work / f"train_tp_{processor}.pt", p.work / f"train_pentad_{processor}"
        if not tp_ds.exists():
            p.tp_preprocess(processor, corpus, tp_ds)
        if not pentad_ds.exists():
            p.pentad_preprocess(workload, corpus, pentad_ds)
        tp_steps, pentad_steps = [], []
        load_before = os.getloadavg()[0]
        for r in range(args.repeats):
            order = ("tp", "pentad") if r % 2 == 0 else ("pentad", "tp")
            for side in order:
                if side == "tp":
                    t = [p.tp_pretrain(workload, tp_ds, n) for n in (low, high)]
                    tp_steps.append((t[1] - t[0]) / (high - low))
                else:
                    t = [p.pentad_pretrain(workload, pentad_ds, n) for n in (low, high)]
                    pentad_steps.append((t[1] - t[0]) / (high - low))
        tp_step, pentad_step = statistics.median(tp_steps), statistics.median(pentad_steps)
        row = {"workload": workload, "batch": args.batch_size, "seq": 128, "threads": args.threads,
               "steps": [low, high], "repeats": args.repeats, "pentad_set": args.pentad_set,
               "tp_step_s": round(tp_step, 4), "pentad_step_s": round(pentad_step, 4),
               "tp_samples_per_s": round(args.batch_size / tp_step, 1),
               "pentad_samples_per_s": round(args.batch_size / pentad_step, 1),
               "ratio": round(tp_step / pentad_step, 2),
               "tp_step_runs": [round(s, 4) for s in tp_steps], "pentad_step_runs": [round(s, 4) for s in pentad_steps],
               "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tencentpretrain", type=Path, required=True, help="a TencentPretrain checkout")
    parser.add_argument("--tp-python", default=sys.executable)
    parser.add_argument("--tp-pythonpath", default="", help="extra PYTHONPATH for TencentPretrain (e.g. for six)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "vs_tencentpretrain")
    parser.add_argument("--only", choices=("preprocess", "pretrain"))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--corpus-mb", type=float, default=53.0, help="preprocessing corpus size")
    parser.add_argument("--workers", type=int, default=2, help="preprocessing processes")
    parser.add_argument("--steps", type=int, nargs=2, default=(10, 40), metavar=("A", "B"))
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per program (median reported)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pentad-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra override of pentad's training runs (repeatable), e.g. "
                        "train.precision=bf16 on a CPU with AMX; recorded in every row")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if not (args.tencentpretrain / "pretrain.py").is_file():
        sys.exit(f"{args.tencentpretrain} is not a TencentPretrain checkout (no pretrain.py)")
    if not TP_DATA.is_dir():
        sys.exit(f"the shared data is not beside the repository ({TP_DATA})")
    args.work.mkdir(parents=True, exist_ok=True)
    programs = Programs(args, args.work)
    import torch

    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
               "python": platform.python_version()}
    if args.only in (None, "pretrain"):
        results["pretrain"] = bench_pretrain(programs, args)
    if args.only in (None, "preprocess"):
        results["preprocess"] = bench_preprocess(programs, args)
    for row in results.get("pretrain", []):
        extra = f" [{' '.join(row['pentad_set'])}]" if row["pentad_set"] else ""
        print(f"pretrain {row['workload']}: TencentPretrain {row['tp_samples_per_s']} samples/s, pentad{extra} "
              f"{row['pentad_samples_per_s']} samples/s: {row['ratio']}x (load {row['load_1min'][0]}-"
              f"{row['load_1min'][1]})")
    for row in results.get("preprocess", []):
        print(f"preprocess {row['processor']} ({row['corpus_mb']} MB, {row['workers']} workers): TencentPretrain "
              f"{row['tp_mb_per_s']} MB/s ({row['tp_peak_mib']} MiB, dataset {row['tp_dataset_mb']} MB), pentad "
              f"{row['pentad_mb_per_s']} MB/s ({row['pentad_peak_mib']} MiB, dataset {row['pentad_dataset_mb']} MB): "
              f"{row['ratio']}x (load {row['load_1min'][0]}-{row['load_1min'][1]})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
