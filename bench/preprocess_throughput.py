"""Preprocess throughput: ``pentad preprocess`` against the raw tokenizer, and its peak memory.

The corpus is a real one repeated to the wanted size in a temporary directory: the cached
Wikipedia excerpt (``pentad.data.assets.ensure_wikipedia_corpus``), one article per line for the
``mlm`` objective and one sentence per line (blank line between articles) for ``bert``; with
``--chinese`` also CLUECorpusSmall (``../shared/data``) with the Chinese vocabulary. The tokenizer
is WordPiece with Google's uncased English vocabulary from ``../shared/data`` (a vocabulary built
with ``pentad.data.vocab_builder.build_vocab`` on the same corpus when that file is absent).

Every preprocess run happens in a fresh subprocess, so each pays its own worker start-up and its
peak memory is its own: the parent samples the resident set of the whole process tree (main
process, forkserver, workers) every 50 ms and reports the peak of the sum (shared library pages
count once per process, so the sum is an upper bound) beside the main process's own high-water
mark (``ru_maxrss``). The same objective at two corpus sizes shows that memory does not grow
with the corpus.

The reference in the same run is the Rust tokenizer alone: ``tokenizers.Tokenizer.encode_batch_fast``
(what pentad's WordPiece tokenizer calls) over the lines of the same corpus in batches of the
same 1 MiB, in a fresh process, once with the library's own thread pool (all cores, as in a
``workers=1`` preprocess) and once on one thread (``TOKENIZERS_PARALLELISM=false``, the cost per
core). That is the ceiling: preprocess tokenizes every byte once, and everything else it does
(reading, building instances, writing shards) comes on top. A ``startup`` row times a run on a
few lines cut into chunks of one line each, so that the worker pool starts: the fixed cost that
dominates small corpora. Two ``pieces`` rows time pentad's ``WordPieceTokenizer.encode_batch``
(the Rust tokenizer behind a cache of pieces, ``docs/data.md``) from a cold cache, on one copy of
the source corpus (text it has not seen: the honest first pass) and on the reference's share of the
repeated corpus (where later copies hit the cache).

Columns: MB/s and Ktok/s (stored tokens, special tokens included) over the wall time of the
``preprocess`` call; CPU s of the work (main process inside the call plus its workers) and
MB/CPU-s, the work done per CPU-second; the peak RSS sums; ``others%``, the CPU that other
processes used during the run as a share of all cores. On a shared machine wall-clock numbers
with a large others% are contended; ``--wait-quiet`` waits for an idle CPU before each run.

Run from the repository root (about 3 minutes on 2 idle cores)::

    PYTHONPATH=src .venv/bin/python bench/preprocess_throughput.py --wait-quiet 120
    PYTHONPATH=src .venv/bin/python bench/preprocess_throughput.py --size-mb 100 --chinese --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHARED_DATA = Path(__file__).resolve().parents[1] / "../shared/data/tencentpretrain"
EN_VOCAB = SHARED_DATA / "models/google_uncased_en_vocab.txt"
ZH_VOCAB = SHARED_DATA / "models/google_zh_vocab.txt"
ZH_DOCS = SHARED_DATA / "corpora/CLUECorpusSmall_sampled.txt"
ZH_SENTENCES = SHARED_DATA / "corpora/CLUECorpusSmall_bert_sampled.txt"
MB = 1_000_000
BATCH_BYTES = 1 << 20  # the preprocess default chunk size, used for the reference's batches too
SAMPLE_SECONDS = 0.05
QUIET_PERCENT = 10.0  # --wait-quiet: machine-wide CPU use below which no one else is running


@dataclass
class Run:
    """One measurement (a preprocess run or a tokenizer reference), as printed and saved."""

    kind: str  # "preprocess", "startup", "tokenizer" or "pieces"
    corpus: str  # "en" / "zh"
    objective: str  # mlm / bert (for the reference: the corpus layout it read)
    megabytes: float
    workers: int  # for the reference: the threads its pool may use (0 = library default)
    seconds: float
    tokens: int
    instances: int
    peak_tree_rss_mb: float
    peak_main_rss_mb: float
    cpu_seconds: float  # user + system of the work: main process inside the timed call + workers
    others_share: float  # CPU used by other processes meanwhile, as a share of all cores

    @property
    def mb_per_s(self) -> float:
        return self.megabytes / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def mb_per_cpu_s(self) -> float:
        return self.megabytes / self.cpu_seconds


# ------------------------------------------------------------------------------- child side
def _tokenizer_config(vocab: Path) -> dict[str, Any]:
    return {"type": "wordpiece", "vocab": str(vocab), "lowercase": True}


def child_preprocess(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one preprocess (in this fresh process); the numbers the parent needs."""
    from pentad.data.objectives import BertObjective, BertObjectiveConfig, MlmObjective, MlmObjectiveConfig
    from pentad.data.preprocess import DEFAULT_CHUNK_BYTES, preprocess
    from pentad.data.tokenizers import WordPieceTokenizer

    cfg = _tokenizer_config(Path(spec["vocab"]))
    tokenizer = WordPieceTokenizer.from_config(cfg)
    if spec["objective"] == "mlm":
        objective: Any = MlmObjective(MlmObjectiveConfig(seq_length=128), tokenizer)
    else:
        objective = BertObjective(BertObjectiveConfig(seq_length=128), tokenizer)
    cpu_before = _own_cpu_seconds()
    start = time.perf_counter()
    manifest = preprocess(objective, tokenizer, cfg, Path(spec["corpus"]), Path(spec["output"]),
                          workers=spec["workers"], progress=False, seed=0,
                          chunk_bytes=spec.get("chunk_bytes", DEFAULT_CHUNK_BYTES))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": manifest["num_tokens"],
            "instances": manifest["num_instances"], "main_maxrss_kb": _own_maxrss_kb(),
            "cpu_seconds": _own_cpu_seconds() - cpu_before, "cpu_total": _own_cpu_seconds()}


def _batches(path: Path, limit: int) -> Iterator[list[str]]:
    """Lines of ``path`` (blank ones dropped) in batches of about BATCH_BYTES, up to ``limit`` bytes."""
    batch: list[str] = []
    size = total = 0
    with open(path, "rb") as f:
        for raw in f:
            total += len(raw)
            size += len(raw)
            text = raw.decode("utf-8").rstrip("\n")
            if text.strip():
                batch.append(text)
            if size >= BATCH_BYTES or total >= limit:
                yield batch
                batch, size = [], 0
            if total >= limit:
                return
    if batch:
        yield batch


def child_tokenizer(spec: dict[str, Any]) -> dict[str, Any]:
    """The reference: the Rust tokenizer's batch encode over the corpus, nothing else; with
    ``pieces``, pentad's ``encode_batch`` (the Rust tokenizer behind a cache of pieces) instead."""
    from pentad.data.tokenizers import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_config(_tokenizer_config(Path(spec["vocab"])))
    backend = tokenizer._backend  # the tokenizers.Tokenizer that preprocess ends up calling
    batches = list(_batches(Path(spec["corpus"]), spec["limit"]))
    num_bytes = sum(len(t.encode("utf-8")) + 1 for b in batches for t in b)
    tokens = lines = 0
    cpu_before = _own_cpu_seconds()
    start = time.perf_counter()
    for batch in batches:
        if spec.get("pieces"):  # pentad's encode_batch: the piece cache, cold at the start
            tokens += sum(len(ids) for ids in tokenizer.encode_batch(batch))
        else:
            tokens += sum(len(e.ids) for e in backend.encode_batch_fast(batch, add_special_tokens=False))
        lines += len(batch)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "instances": lines, "bytes": num_bytes,
            "main_maxrss_kb": _own_maxrss_kb(), "cpu_seconds": _own_cpu_seconds() - cpu_before,
            "cpu_total": _own_cpu_seconds()}


def _own_maxrss_kb() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # kB on Linux


def _own_cpu_seconds() -> float:
    """CPU seconds of this process so far, all its threads (the tokenizer's Rust pool included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------------ parent side
@dataclass
class ChildRun:
    result: dict[str, Any]
    peak_tree_rss_mb: float
    cpu_seconds: float  # the measured work: the child's own CPU inside the timed part + its workers'
    others_share: float  # CPU used by other processes during the run, as a share of the machine


def run_child(mode: str, spec: dict[str, Any], env_extra: dict[str, str] | None = None) -> ChildRun:
    """Run this script in ``--child`` mode, sampling its process tree until it exits.

    Worker CPU comes from the last sample of each process, so a worker's final few
    milliseconds may be missed. ``others_share`` compares the machine's busy time with the
    tree's (and this sampler's): above a few percent, the wall-clock numbers are contended.
    """
    import psutil

    env = dict(os.environ)
    env.update(env_extra or {})
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    busy_before, own_before, wall_before = _machine_busy(psutil), time.process_time(), time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        total = 0
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            members = []
        for member in members:
            try:
                with member.oneshot():
                    total += member.memory_info().rss
                    times = member.cpu_times()
                cpu[member.pid] = times.user + times.system
            except psutil.Error:
                pass  # a worker that just exited
        peak = max(peak, total)
        time.sleep(SAMPLE_SECONDS)
    out, err = proc.communicate()
    wall = time.perf_counter() - wall_before
    others = _machine_busy(psutil) - busy_before - (time.process_time() - own_before)
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} {spec} failed ({proc.returncode}):\n{err[-4000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    # The child's own totals are exact (it reports them); its workers' come from the samples.
    cpu.pop(proc.pid, None)
    workers_cpu = sum(cpu.values())
    others -= result["cpu_total"] + workers_cpu
    return ChildRun(result, peak / MB, result["cpu_seconds"] + workers_cpu,
                    max(0.0, others) / (wall * (os.cpu_count() or 1)))


def _machine_busy(psutil: Any) -> float:
    """CPU seconds the whole machine has been busy (all cores, since boot)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def repeat_corpus(source: Path, target: Path, size: int, separator: bytes = b"") -> int:
    """Write copies of ``source`` to ``target`` until it holds at least ``size`` bytes."""
    data = source.read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    data += separator  # e.g. a blank line, so two copies of a sentence corpus stay two documents
    written = 0
    with open(target, "wb") as f:
        while written < size:
            f.write(data)
            written += len(data)
    return written


def english_vocab(workdir: Path) -> Path:
    """Google's uncased vocab.txt when present, else a WordPiece vocab built on the corpus."""
    if EN_VOCAB.is_file():
        return EN_VOCAB
    from pentad.data.assets import default_cache_dir, ensure_wikipedia_corpus
    from pentad.data.vocab_builder import build_vocab

    wiki = ensure_wikipedia_corpus(default_cache_dir(), progress=False)
    cfg = build_vocab([wiki.docs_path], "wordpiece", 30522, workdir / "vocab", show_progress=False)
    return workdir / "vocab" / cfg["vocab"]


def print_header() -> None:
    print(f"{'kind':<11}{'corpus':<7}{'objective':<10}{'MB':>6}{'workers':>8}{'s':>7}{'MB/s':>7}"
          f"{'Ktok/s':>7}{'instances':>10}{'CPU s':>7}{'MB/CPU-s':>9}{'peak tree RSS MB':>17}"
          f"{'main RSS MB':>12}{'others%':>8}", flush=True)


def print_row(r: Run) -> None:
    workers = "all" if r.kind == "tokenizer" and r.workers == 0 else str(r.workers)
    print(f"{r.kind:<11}{r.corpus:<7}{r.objective:<10}{r.megabytes:>6.1f}{workers:>8}"
          f"{r.seconds:>7.1f}{r.mb_per_s:>7.2f}{r.tokens_per_s / 1e3:>7.0f}{r.instances:>10,}"
          f"{r.cpu_seconds:>7.1f}{r.mb_per_cpu_s:>9.2f}{r.peak_tree_rss_mb:>17.0f}"
          f"{r.peak_main_rss_mb:>12.0f}{r.others_share:>8.0%}", flush=True)


def wait_until_quiet(limit: float) -> None:
    """Wait (at most ``limit`` seconds) until other processes leave the CPU nearly idle."""
    import psutil

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and psutil.cpu_percent(interval=2.0) > QUIET_PERCENT:
        pass


def measure(kind: str, lang: str, objective: str, workers: int, spec: dict[str, Any],
            repeat: int, wait_quiet: float, env: dict[str, str] | None = None) -> Run:
    """The fastest of ``repeat`` runs of one configuration, each in a fresh subprocess."""
    best: Run | None = None
    for _ in range(repeat):
        wait_until_quiet(wait_quiet)
        child = run_child("preprocess" if kind in ("preprocess", "startup") else "tokenizer", spec, env)
        res = child.result
        megabytes = res["bytes"] / MB if "bytes" in res else Path(spec["corpus"]).stat().st_size / MB
        run = Run(kind, lang, objective, megabytes, workers, res["seconds"], res["tokens"],
                  res["instances"], child.peak_tree_rss_mb, res["main_maxrss_kb"] / 1e3,
                  child.cpu_seconds, child.others_share)
        _remove_tree(Path(spec.get("output", "/nonexistent")))
        if best is None or run.seconds < best.seconds:
            best = run
    assert best is not None
    print_row(best)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=50, help="corpus size for the speed runs")
    parser.add_argument("--small-mb", type=float, default=25,
                        help="second corpus size, to compare peak memory (0 = skip)")
    parser.add_argument("--reference-mb", type=float, default=8,
                        help="how much of the corpus the tokenizer reference reads")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--objectives", default="mlm,bert", help="comma-separated: mlm, bert")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per configuration; the fastest is reported")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="before each run, wait up to this long for other processes to leave "
                             "the CPU idle (for shared machines)")
    parser.add_argument("--chinese", action="store_true", help="also CLUECorpusSmall (Chinese)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, spec = args.child[0], json.loads(args.child[1])
        result = child_preprocess(spec) if mode == "preprocess" else child_tokenizer(spec)
        print(json.dumps(result))
        return

    from pentad.data.assets import default_cache_dir, ensure_wikipedia_corpus

    workers = [int(w) for w in args.workers.split(",")]
    objectives = args.objectives.split(",")
    wiki = ensure_wikipedia_corpus(default_cache_dir(), progress=False)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at start",
          flush=True)
    started = time.perf_counter()
    runs: list[Run] = []
    print_header()
    with tempfile.TemporaryDirectory(prefix="pentad-preprocess-bench.") as tmp:
        workdir = Path(tmp)
        languages = [("en", english_vocab(workdir), wiki.docs_path, wiki.sentences_path)]
        if args.chinese:
            if ZH_VOCAB.is_file() and ZH_DOCS.is_file() and ZH_SENTENCES.is_file():
                languages.append(("zh", ZH_VOCAB, ZH_DOCS, ZH_SENTENCES))
            else:
                print(f"--chinese: {SHARED_DATA} lacks the Chinese corpus or vocab; skipped")
        for lang, vocab, docs, sentences in languages:
            for objective in objectives:
                source, separator = (docs, b"") if objective == "mlm" else (sentences, b"\n")
                sizes = [args.size_mb] + ([args.small_mb] if args.small_mb else [])
                corpora = {}
                for mb in sizes:
                    corpora[mb] = workdir / f"{lang}-{objective}-{mb:g}MB.txt"
                    repeat_corpus(source, corpora[mb], int(mb * MB), separator)
                base = {"vocab": str(vocab), "objective": objective}
                # The reference first, on the big corpus: the library's threads, then one thread.
                for threads, env in ((0, {}), (1, {"TOKENIZERS_PARALLELISM": "false"})):
                    runs.append(measure("tokenizer", lang, objective, threads,
                                        {**base, "corpus": str(corpora[args.size_mb]),
                                         "limit": int(args.reference_mb * MB)}, 1, args.wait_quiet,
                                        env))
                # pentad's piece cache, cold at the start: over one copy of the corpus (text it has
                # not seen) and over the reference's share of the repeated corpus.
                for limit in (source.stat().st_size, int(args.reference_mb * MB)):
                    runs.append(measure("pieces", lang, objective, 1,
                                        {**base, "corpus": str(corpora[args.size_mb]), "limit": limit,
                                         "pieces": True}, 1, args.wait_quiet))
                # The fixed cost of a worker pool: a few lines, one chunk each, with the most workers.
                tiny = workdir / f"{lang}-{objective}-tiny.txt"
                with open(source, "rb") as f:
                    tiny.write_bytes(b"".join(f.readline() for _ in range(3)))
                runs.append(measure("startup", lang, objective, max(workers),
                                    {**base, "corpus": str(tiny), "workers": max(workers),
                                     "chunk_bytes": 1, "output": str(workdir / "out-tiny")},
                                    args.repeat, args.wait_quiet))
                plan = [(args.size_mb, w) for w in workers] + [(mb, max(workers)) for mb in sizes[1:]]
                for mb, w in plan:
                    runs.append(measure("preprocess", lang, objective, w,
                                        {**base, "corpus": str(corpora[mb]), "workers": w,
                                         "output": str(workdir / f"out-{lang}-{objective}-{mb:g}-{w}")},
                                        args.repeat, args.wait_quiet))
                for mb in sizes:
                    corpora[mb].unlink()
    summary = summarise(runs, workers)
    print()
    for line in summary["lines"]:
        print(line)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f} at "
          f"the end. others% = CPU used by other processes during a run, as a share of all "
          f"cores: above a few percent the wall-clock numbers are contended (MB/CPU-s much less).")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version()},
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "runs": [dict(asdict(r), mb_per_s=r.mb_per_s, tokens_per_s=r.tokens_per_s,
                          mb_per_cpu_s=r.mb_per_cpu_s) for r in runs],
            "summary": summary["values"]}, indent=2) + "\n")
        print(f"wrote {args.json}")


def summarise(runs: list[Run], workers: list[int]) -> dict[str, Any]:
    """Speed-ups, ratios to the reference and memory growth, as lines and values."""
    lines: list[str] = []
    values: dict[str, Any] = {}
    for lang, objective in sorted({(r.corpus, r.objective) for r in runs}):
        key = f"{lang}/{objective}"
        mine = [r for r in runs if (r.corpus, r.objective) == (lang, objective)]
        pre = [r for r in mine if r.kind == "preprocess"]
        ref = {r.workers: r for r in mine if r.kind == "tokenizer"}
        startup = [r for r in mine if r.kind == "startup"]
        if not pre:
            continue
        biggest = max(r.megabytes for r in pre)
        at_big = {r.workers: r for r in pre if r.megabytes == biggest}
        one, most = at_big[min(workers)], at_big[max(workers)]
        if one is not most:
            speedup = most.mb_per_s / one.mb_per_s
            values[f"{key}/speedup_{max(workers)}_vs_{min(workers)}"] = speedup
            lines.append(f"{key}: workers={max(workers)} vs {min(workers)}: {speedup:.2f}x "
                         f"({most.mb_per_s:.2f} vs {one.mb_per_s:.2f} MB/s)")
        if 0 in ref and 1 in ref:
            best = max(at_big.values(), key=lambda r: r.mb_per_s)
            wall, cpu = best.mb_per_s / ref[0].mb_per_s, best.mb_per_cpu_s / ref[1].mb_per_cpu_s
            values[f"{key}/fraction_of_tokenizer_wall"] = wall
            values[f"{key}/fraction_of_tokenizer_cpu"] = cpu
            lines.append(f"{key}: preprocess (workers={best.workers}) at {wall:.0%} of the raw "
                         f"tokenizer's all-core speed ({ref[0].mb_per_s:.2f} MB/s) and {cpu:.0%} of "
                         f"its work per CPU-second ({ref[1].mb_per_cpu_s:.2f} MB/CPU-s, one thread)")
        for r in (r for r in mine if r.kind == "pieces" and 0 in ref):
            gain = r.mb_per_cpu_s / ref[0].mb_per_cpu_s
            values[f"{key}/pieces_{r.megabytes:.1f}MB_cpu_gain"] = gain
            lines.append(f"{key}: piece cache over {r.megabytes:.1f} MB (cold at the start): {r.mb_per_cpu_s:.2f} "
                         f"MB/CPU-s, {gain:.1f}x the Rust tokenizer's {ref[0].mb_per_cpu_s:.2f} (all cores); "
                         f"{r.mb_per_s:.2f} MB/s on one thread")
        if startup:
            values[f"{key}/startup_seconds"] = startup[0].seconds
            lines.append(f"{key}: fixed cost of a run with workers={startup[0].workers}: "
                         f"{startup[0].seconds:.2f} s, {startup[0].cpu_seconds:.1f} CPU-s")
        by_size = sorted((r for r in pre if r.workers == max(workers)), key=lambda r: r.megabytes)
        if len(by_size) >= 2:
            small, large = by_size[0], by_size[-1]
            growth = large.peak_tree_rss_mb / small.peak_tree_rss_mb
            values[f"{key}/peak_rss_growth"] = growth
            lines.append(f"{key}: peak tree RSS {small.peak_tree_rss_mb:.0f} MB at "
                         f"{small.megabytes:.0f} MB of corpus, {large.peak_tree_rss_mb:.0f} MB at "
                         f"{large.megabytes:.0f} MB ({growth:.2f}x for "
                         f"{large.megabytes / small.megabytes:.1f}x the corpus)")
    return {"lines": lines, "values": values}


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
