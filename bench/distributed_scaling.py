"""Distributed scaling on CPU: one process against two ranks, through the real ``pentad pretrain``.

Pre-training tokens/s of the same run (same model, same data, same global batch) in four
configurations, each a fresh command line exactly as a user types it:

* ``(a) 1x2``: one process, ``train.threads=2`` (the reference every ratio is taken against);
* ``(b) 1x1``: one process, ``train.threads=1``;
* ``(c) ddp``: ``torchrun --nproc_per_node=2 -m pentad pretrain ... train.strategy=ddp``, one thread per rank;
* ``(d) fsdp``: the same with ``train.strategy=fsdp`` (skipped, with a note, where that strategy is
  not available in this checkout).

``train.batch_size`` is the global micro-batch, so each rank of (c)/(d) takes half of every batch and
all four train on the same sequences. Two workloads, on real Chinese text from the shared data
(``../shared/data/tencentpretrain/corpora``, TencentPretrain's CLUECorpusSmall samples):

* ``bert``: ``bert/mini`` (L4 H256 A4), masked LM + next sentence (objective ``bert``), with the
  Chinese BERT vocabulary (``google_zh_vocab.txt``, 21,128 words) of the README quickstart;
* ``gpt2``: ``gpt2/base`` shrunk to L4 H256 A4, causal LM (objective ``lm``, packed windows), with a
  byte-level BPE vocabulary of 8,000 tokens built from the corpus by ``pentad vocab build``.

Each run logs every ``--log-every`` steps; the first ``--skip`` intervals (model build, oneDNN
warm-up, first optimizer step) are dropped and the rest give the run's tokens/s (all tokens over all
time: the harmonic mean of the intervals, which have the same number of steps). Every model first gets
an untimed warm-up run. Repetitions interleave the configurations (the order rotates each repetition),
and the table gives the median tokens/s and the median of the per-repetition ratios to (a), so a
background load that comes and goes hits every configuration alike. Beside the 1-minute load average
before and after, the "others" column is the CPU the *other* processes on the machine used during a
run, in cores (``/proc/stat`` busy time less this benchmark's own children): on a machine shared with
other jobs that is what the numbers must be read against. ``--busy N`` adds N processes spinning on one
core each beside every timed run (not counted as "others"): a busy shared machine, reproducibly.

Run from the repository root, with the shared data beside it::

    PYTHONPATH=src .venv/bin/python bench/distributed_scaling.py            # ~6-10 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/distributed_scaling.py --quick    # ~2 min, one repetition
    PYTHONPATH=src .venv/bin/python bench/distributed_scaling.py --busy 1   # beside one busy process
    PYTHONPATH=src .venv/bin/python bench/distributed_scaling.py --dry-run  # print the commands only
    PYTHONPATH=src .venv/bin/python bench/distributed_scaling.py --pool a.json b.json  # runs grouped by load
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tencentpretrain"
PORTS = range(29900, 30000)  # the launches' --master_port, a free one picked each time
SMALL = ["model.hidden_size=256", "model.encoder.num_layers=4", "model.encoder.num_heads=4",
         "model.encoder.ffn_size=1024"]


@dataclass(frozen=True)
class Workload:
    """One model and the corpus it pre-trains on."""

    name: str
    recipe: str
    corpus: str  # file under <data>/corpora
    lines: int  # corpus lines preprocessed (enough instances for every run)
    objective: str
    overrides: tuple[str, ...]


WORKLOADS = {
    "bert": Workload("bert", "bert/mini", "CLUECorpusSmall_bert_sampled.txt", 3000, "bert", ()),
    "gpt2": Workload("gpt2", "gpt2/base", "CLUECorpusSmall_sampled.txt", 600, "lm", tuple(SMALL)),
}
BPE_VOCAB_SIZE = 8000


@dataclass(frozen=True)
class Setup:
    """One configuration: processes, threads per process, strategy."""

    key: str
    label: str
    nproc: int
    threads: int
    strategy: str


def setups(threads: int) -> list[Setup]:
    half = max(1, threads // 2)
    return [Setup("1x2", f"(a) 1 process x {threads} threads", 1, threads, "single"),
            Setup("1x1", "(b) 1 process x 1 thread", 1, 1, "single"),
            Setup("ddp", f"(c) 2 ranks x {half} thread ddp", 2, half, "ddp"),
            Setup("fsdp", f"(d) 2 ranks x {half} thread fsdp", 2, half, "fsdp")]


@dataclass
class Result:
    model: str
    setup: str
    rep: int
    tokens_per_s: float | None
    intervals: list[float]
    wall_s: float
    others_cores: float | None  # CPU used by other processes during the run, in cores
    load_before: float
    load_after: float
    error: str | None = None
    log: str | None = None


@dataclass
class Plan:
    workdir: Path
    data: Path
    reps: int
    steps: int
    log_every: int
    skip: int
    batch_size: int
    seq_length: int
    threads: int
    models: list[str]
    setups: list[Setup]
    busy: int = 0  # spinning processes beside every timed run
    skipped: dict[str, str] = field(default_factory=dict)  # setup key -> why


# ----------------------------------------------------------------------------------- helpers
def free_port() -> int:
    """A free port in 29900-29999 (any free port if all of those are taken)."""
    for port in random.sample(list(PORTS), len(PORTS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``; 0 where absent)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Spinners:
    """``n`` processes that each keep one core busy (pure Python) while they are open: a machine
    shared with a busy job, reproducibly (as in ``bench/threads_under_load.py``)."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Spinners:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        if self.procs:
            time.sleep(0.3)
        return self

    def cpu(self) -> float:
        """CPU seconds the spinners have used so far (``/proc/PID/stat``; 0 where absent)."""
        total = 0
        for proc in self.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def load() -> float:
    return os.getloadavg()[0]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # train.threads decides
    env.update(GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    src = str(ROOT / "src")
    if src not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def pentad(*args: str) -> list[str]:
    return [sys.executable, "-m", "pentad", *args]


def model_args(plan: Plan, name: str) -> list[str]:
    """Config arguments shared by ``preprocess`` and ``pretrain`` for a workload."""
    w = WORKLOADS[name]
    if name == "bert":
        vocab = plan.data / "models" / "google_zh_vocab.txt"
        tok = ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}", "model.vocab_size=21128"]
    else:
        bpe = plan.workdir / "gpt2_bpe"
        tok = ["tokenizer.type=bpe", f"tokenizer.vocab={bpe / 'vocab.json'}", f"tokenizer.merges={bpe / 'merges.txt'}",
               f"model.vocab_size={BPE_VOCAB_SIZE}"]
    return ["--config", w.recipe, *tok, *w.overrides, f"model.max_seq_length={plan.seq_length}",
            f"data.objective={w.objective}", f"data.objective.seq_length={plan.seq_length}"]


def pretrain_command(plan: Plan, name: str, setup: Setup, output: Path, port: int | None = None,
                     steps: int | None = None) -> list[str]:
    args = ["pretrain", *model_args(plan, name), f"data.dataset={plan.workdir / (name + '_ds')}", f"output={output}",
            f"train.steps={steps or plan.steps}", f"train.log_every={plan.log_every}",
            f"train.batch_size={plan.batch_size}", f"train.threads={setup.threads}",
            f"train.strategy={setup.strategy}", "train.progress=false", "train.tensorboard=false",
            "train.save_minutes=null"]
    if setup.nproc == 1:
        return pentad(*args)
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={setup.nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port or PORTS[0]}", "-m", "pentad", *args]


def shown(cmd: list[str]) -> str:
    """A command as a user would type it (``torchrun``/``pentad`` for the module invocations)."""
    text = " ".join(cmd)
    return (text.replace(f"{sys.executable} -m torch.distributed.run", "torchrun")
            .replace(f"{sys.executable} -m pentad", "pentad"))


# ------------------------------------------------------------------------------------- data
def prepare(plan: Plan) -> None:
    """The GPT-2 vocabulary and one dataset per workload, by pentad's own commands."""
    env = child_env()
    for name in plan.models:
        w = WORKLOADS[name]
        corpus = plan.data / "corpora" / w.corpus
        sliced = plan.workdir / f"{name}_corpus.txt"
        with corpus.open(encoding="utf-8") as src, sliced.open("w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i >= w.lines:
                    break
                dst.write(line)
        if name == "gpt2":
            subprocess.run(pentad("vocab", "build", "--corpus", str(sliced), "--kind", "bpe", "--cased",
                                  "--vocab-size", str(BPE_VOCAB_SIZE), "--output", str(plan.workdir / "gpt2_bpe")),
                           env=env, check=True, capture_output=True, text=True)
        proc = subprocess.run(pentad("preprocess", *model_args(plan, name), f"data.corpus={sliced}",
                                     f"data.output={plan.workdir / (name + '_ds')}", "data.workers=1"),
                              env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"preprocess of {name} failed:\n{proc.stderr[-3000:]}")
        wrote = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("wrote")]
        print(f"  {name}: {wrote[-1] if wrote else 'preprocessed'}", flush=True)


# -------------------------------------------------------------------------------------- runs
def read_rate(run: Path, skip: int) -> tuple[float | None, list[float]]:
    """Tokens/s over the logged intervals after the first ``skip``: total tokens over total time."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return None, []
    rates = [r["tokens_per_s"] for r in map(json.loads, path.read_text().splitlines()) if "tokens_per_s" in r]
    kept = rates[skip:]
    if not kept or min(kept) <= 0:
        return None, rates
    return len(kept) / sum(1.0 / r for r in kept), rates


def run_once(plan: Plan, name: str, setup: Setup, rep: int, attempts: int = 2) -> Result:
    run_dir = plan.workdir / "runs" / f"{name}-{setup.key}-{rep}"
    log = plan.workdir / "logs" / f"{name}-{setup.key}-{rep}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(attempts):
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = pretrain_command(plan, name, setup, run_dir, port=free_port())
        with Spinners(plan.busy) as spinners:
            load_before, busy0, ours0, spun0 = load(), busy_seconds(), children_seconds(), spinners.cpu()
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
            wall = time.perf_counter() - start
            busy, ours = busy_seconds() - busy0, children_seconds() - ours0
            ours += spinners.cpu() - spun0  # the deliberate load is not "other processes"
        log.write_text(shown(cmd) + "\n\n" + proc.stdout + proc.stderr, encoding="utf-8")
        # pentad's own "error:" line is a real failure; anything else from the launcher gets one retry
        if proc.returncode == 0 or "error:" in proc.stderr or attempt == attempts - 1:
            break
    others = max(0.0, busy - ours) / wall if busy else None
    rate, intervals = read_rate(run_dir, plan.skip)
    error = None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()] or proc.stderr.splitlines()[-1:]
        error = f"exit {proc.returncode}: {lines[-1][:300] if lines else ''}"
    elif rate is None:
        error = f"no tokens_per_s after the first {plan.skip} interval(s) in {run_dir / 'metrics.jsonl'}"
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints of ~100 MB each
    return Result(name, setup.key, rep, rate, intervals, wall, others, load_before, load(), error, str(log))


def warm_up(plan: Plan, name: str) -> None:
    """One short untimed single-process run: page cache, imports, the first oneDNN primitives."""
    run_dir = plan.workdir / "runs" / f"{name}-warmup"
    cmd = pretrain_command(plan, name, plan.setups[0], run_dir, steps=2)
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"warm-up of {name} failed ({shown(cmd)}):\n{proc.stderr[-3000:]}")
    shutil.rmtree(run_dir, ignore_errors=True)


def available_strategies() -> set[str]:
    from pentad.training.strategies import STRATEGIES

    return set(STRATEGIES.names())


# ------------------------------------------------------------------------------------ report
def summarise(plan: Plan, results: list[Result]) -> list[dict[str, Any]]:
    rows = []
    for name in plan.models:
        ref = {r.rep: r.tokens_per_s for r in results if r.model == name and r.setup == plan.setups[0].key}
        for setup in plan.setups:
            mine = [r for r in results if r.model == name and r.setup == setup.key]
            ok = [r for r in mine if r.tokens_per_s]
            ratios = [r.tokens_per_s / ref[r.rep] for r in ok if ref.get(r.rep)]
            others = [r.others_cores for r in mine if r.others_cores is not None]
            measured = [r for r in ok if r.others_cores is not None]
            quietest = min(measured, key=lambda r: r.others_cores) if measured else None
            rows.append({
                "model": name, "setup": setup.key, "label": setup.label,
                "tokens_per_s": statistics.median([r.tokens_per_s for r in ok]) if ok else None,
                "ratio": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "others_cores": statistics.median(others) if others else None,
                "quietest": {"tokens_per_s": quietest.tokens_per_s, "others_cores": quietest.others_cores,
                             "rep": quietest.rep} if quietest else None,
                "runs": len(ok), "failed": [r.error for r in mine if r.error],
            })
    return rows


def pooled(paths: list[Path], quiet: float = 0.25, busy: float = 1.0) -> str:
    """The runs of several ``--json`` files grouped by the other processes' CPU during each run: the
    median tokens/s of the runs with less than ``quiet`` cores of other load, and of those with at least
    ``busy``, each with its ratio to the median of (a) in the same group."""
    runs = [r for path in paths for r in json.loads(path.read_text())["runs"]
            if r["tokens_per_s"] and r["others_cores"] is not None]
    labels = {s.key: s.label for s in setups(2)}
    for path in paths:  # the labels of the files' own --threads
        labels.update({row["setup"]: row["label"] for row in json.loads(path.read_text())["summary"]})
    groups = ((f"others < {quiet:g} cores", lambda c: c < quiet), (f"others >= {busy:g} cores", lambda c: c >= busy))
    out = [f"pooled over {len(paths)} file(s), {len(runs)} runs",
           "| model | configuration | " + " | ".join(f"{g}: runs, tokens/s, vs (a)" for g, _ in groups) + " |",
           "|---|---|" + "---:|" * len(groups)]
    models = sorted({r["model"] for r in runs}, key=list(WORKLOADS).index)
    keys = [k for k in labels if any(r["setup"] == k for r in runs)]
    for model in models:
        cells: dict[str, list[str]] = {k: [] for k in keys}
        for _, test in groups:
            medians = {k: statistics.median(xs) for k in keys
                       if (xs := [r["tokens_per_s"] for r in runs
                                  if r["model"] == model and r["setup"] == k and test(r["others_cores"])])}
            counts = {k: sum(r["model"] == model and r["setup"] == k and test(r["others_cores"]) for r in runs)
                      for k in keys}
            ref = medians.get("1x2")
            for k in keys:
                cells[k].append("-" if k not in medians else
                                f"{counts[k]}, {medians[k]:.0f}, {medians[k] / ref:.2f}" if ref else
                                f"{counts[k]}, {medians[k]:.0f}, -")
        out += [f"| {model} | {labels[k]} | " + " | ".join(cells[k]) + " |" for k in keys]
    return "\n".join(out)


def table(plan: Plan, rows: list[dict[str, Any]]) -> str:
    out = ["| model | configuration | tokens/s (median) | vs (a) (median) | vs (a) range | others (cores) "
           "| quietest run: tokens/s (others) | runs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["setup"] in plan.skipped:
            out.append(f"| {r['model']} | {r['label']} | skipped: {plan.skipped[r['setup']]} | | | | | 0 |")
            continue
        q = r["quietest"]
        quiet = f"{q['tokens_per_s']:.0f} ({q['others_cores']:.2f})" if q else "-"
        tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "failed"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        spread = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}" if r["ratio"] else "-"
        others = f"{r['others_cores']:.2f}" if r["others_cores"] is not None else "-"
        out.append(f"| {r['model']} | {r['label']} | {tps} | {ratio} | {spread} | {others} | {quiet} | {r['runs']} |")
    return "\n".join(out)


# -------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one repetition of 6 steps (~2 min)")
    p.add_argument("--models", default="bert,gpt2", help="comma-separated: bert, gpt2")
    p.add_argument("--configs", default="1x2,1x1,ddp,fsdp",
                   help="comma-separated: 1x2 (the reference, always run), 1x1, ddp, fsdp")
    p.add_argument("--reps", type=int, default=None, help="repetitions of every configuration (default 3; --quick 1)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 12; --quick 6)")
    p.add_argument("--log-every", type=int, default=2, help="steps per logged interval")
    p.add_argument("--skip", type=int, default=1, help="first logged intervals left out of the rate")
    p.add_argument("--batch-size", type=int, default=16, help="global batch (each of 2 ranks takes half)")
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--busy", type=int, default=0,
                   help="processes spinning on one core each beside every timed run (a busy shared machine)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads of the reference process (a); each of the 2 ranks gets half")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help="the shared TencentPretrain data (corpora/ and models/google_zh_vocab.txt)")
    p.add_argument("--workdir", type=Path, default=None, help="keep vocabularies, datasets and logs here")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    p.add_argument("--pool", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: group the runs of earlier --json files by the other processes' load")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for values, allowed, flag in ((args.models, WORKLOADS, "--models"), (args.configs, ("1x2", "1x1", "ddp", "fsdp"),
                                                                         "--configs")):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            p.error(f"{flag}: unknown or empty {', '.join(bad)} (choose from {', '.join(allowed)})")
    args.reps = args.reps or (1 if args.quick else 3)
    args.steps = args.steps or (6 if args.quick else 12)
    if args.steps // args.log_every <= args.skip:
        p.error(f"--steps {args.steps} with --log-every {args.log_every} logs {args.steps // args.log_every} "
                f"interval(s), none left after --skip {args.skip}")
    if args.batch_size % 2:
        p.error(f"--batch-size {args.batch_size}: the 2-rank runs need an even global batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.pool:
        print(pooled(args.pool))
        return 0
    chosen = ["1x2"] + [c for c in args.configs if c != "1x2"]
    plan = Plan(workdir=args.workdir or Path(tempfile.mkdtemp(prefix="pentad-scaling-")), data=args.data,
                reps=args.reps, steps=args.steps, log_every=args.log_every, skip=args.skip,
                batch_size=args.batch_size, seq_length=args.seq_length, threads=args.threads, models=args.models,
                setups=[s for s in setups(args.threads) if s.key in chosen], busy=args.busy)
    strategies = available_strategies()
    for s in plan.setups:
        if s.strategy not in strategies:
            plan.skipped[s.key] = f"train.strategy={s.strategy} is not in this checkout"
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    given = sys.argv[1:] if argv is None else argv
    env = {"torch": torch.__version__, "python": platform.python_version(), "cores": cores,
           "cpu": platform.processor() or platform.machine(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "command": " ".join(["python", "bench/distributed_scaling.py", *given])}
    print(f"torch {env['torch']}, python {env['python']}, {cores} cores ({env['cpu_capability']}); "
          f"global batch {plan.batch_size} x seq {plan.seq_length}, {plan.steps} steps per run (logged every "
          f"{plan.log_every}, first {plan.skip} interval(s) left out), {plan.reps} repetition(s), fp32"
          + (f"; {plan.busy} busy process(es) beside every timed run" if plan.busy else ""))
    print("commands" + ("" if args.dry_run else " (of (a) and (c); the others differ in train.threads and "
                                                 "train.strategy, every log in the work directory starts with its own)")
          + ":")
    for name in plan.models:
        for s in plan.setups:
            if not args.dry_run and s.key not in ("1x2", "ddp"):
                continue
            note = f"   [skipped: {plan.skipped[s.key]}]" if s.key in plan.skipped else ""
            print(f"  {shown(pretrain_command(plan, name, s, plan.workdir / 'runs' / f'{name}-{s.key}'))}{note}")
    if args.dry_run:
        if args.workdir is None:
            shutil.rmtree(plan.workdir, ignore_errors=True)
        return 0
    missing = [p for p in (plan.data / "corpora", plan.data / "models" / "google_zh_vocab.txt") if not p.exists()]
    if missing:
        raise SystemExit(f"missing {', '.join(map(str, missing))}: pass --data DIR, the shared TencentPretrain "
                         f"data (corpora/ and models/)")
    plan.workdir.mkdir(parents=True, exist_ok=True)
    started, load_start = time.perf_counter(), os.getloadavg()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in load_start)}\npreparing data in {plan.workdir}",
          flush=True)
    prepare(plan)
    for name in plan.models:
        warm_up(plan, name)
    print("| rep | model | configuration | tokens/s | per-interval tokens/s | wall s | others (cores) | load |\n"
          "|---:|---|---|---:|---|---:|---:|---:|", flush=True)
    active = [s for s in plan.setups if s.key not in plan.skipped]
    results: list[Result] = []
    for rep in range(plan.reps):
        for name in plan.models:
            order = active[rep % len(active):] + active[:rep % len(active)]  # rotate who goes first
            for setup in order:
                r = run_once(plan, name, setup, rep)
                results.append(r)
                rate = f"{r.tokens_per_s:.0f}" if r.tokens_per_s else f"failed ({r.error}; log {r.log})"
                others = f"{r.others_cores:.2f}" if r.others_cores is not None else "-"
                print(f"| {rep} | {name} | {setup.label} | {rate} | {' '.join(f'{v:.0f}' for v in r.intervals)} "
                      f"| {r.wall_s:.1f} | {others} | {r.load_before:.2f} -> {r.load_after:.2f} |", flush=True)
    load_end = os.getloadavg()
    rows = summarise(plan, results)
    print(f"\n{table(plan, rows)}\n")
    print(f"load average (1, 5, 15 min) before: {' '.join(f'{v:.2f}' for v in load_start)}; "
          f"after: {' '.join(f'{v:.2f}' for v in load_end)}; total {time.perf_counter() - started:.0f} s")
    for key, why in plan.skipped.items():
        print(f"note: {key} skipped: {why}")
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"failed: {r.model} {r.setup} rep {r.rep}: {r.error} (log {r.log})")
    if args.json:
        args.json.write_text(json.dumps({
            "env": env, "plan": {k: v for k, v in vars(args).items() if k not in ("json", "data", "workdir")},
            "load_before": load_start, "load_after": load_end, "skipped": plan.skipped, "summary": rows,
            "runs": [vars(r) for r in results]}, indent=2, default=str))
        print(f"wrote {args.json}")
    if args.workdir is None and not failed:
        shutil.rmtree(plan.workdir, ignore_errors=True)
    elif failed:
        print(f"logs kept in {plan.workdir / 'logs'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
