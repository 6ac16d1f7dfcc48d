"""``pentad preprocess``: corpus -> token shards, in one streaming pass with worker processes.

The main process reads the corpus in chunks (:mod:`pentad.data.corpus`), keeps at most
``2 * workers`` chunks in flight, and writes each chunk's instances as soon as it is its turn, so
memory is bounded by the chunk size, never by the corpus. Workers decode, check and tokenize
lines and build instances with a generator seeded by ``(seed, chunk index)``; because chunk
boundaries do not depend on the number of workers, ``workers=1`` and ``workers=8`` write the same
bytes. Objectives that pack across documents return a token stream that the main process cuts
into windows, carrying the remainder over to the next chunk.

Everything is written into a temporary directory beside ``output`` and renamed into place at the
end, so ``output`` is either absent or complete.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pentad.data.corpus import BadLine, Chunk, check_corpus, count_lines, decode_line, first_line, is_blank, read_chunks
from pentad.data.objectives.base import Objective, windows
from pentad.data.shards import (
    FIELD_DTYPE,
    FORMAT_NAME,
    FORMAT_VERSION,
    Instances,
    ShardWriter,
    token_dtype_for,
    write_manifest,
)
from pentad.data.tsv import LabelMap
from pentad.errors import UserError
from pentad.files import temporary_dir

DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_SHARD_TOKENS = 1 << 28
MAX_REPORTED_SKIPS = 10


@dataclass
class _Job:
    """What a worker needs to turn chunks into instances (pickled once per worker)."""

    objective: Objective
    context: Any
    corpus: str
    on_bad_line: str
    seed: int


@dataclass
class _ChunkResult:
    index: int
    num_bytes: int
    output: Instances | np.ndarray
    skipped: list[tuple[int, str]] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)


def _run_chunk(job: _Job, chunk: Chunk) -> _ChunkResult:
    """Decode, parse and build one chunk (runs in a worker, or in-process when workers=1)."""
    objective = job.objective
    items: list[Any] = []
    skipped: list[tuple[int, str]] = []
    for k, raw in enumerate(chunk.lines):
        line_no = chunk.first_line + k
        try:
            items.append(objective.parse_line(decode_line(raw, line_no), job.context))
        except BadLine as bad:
            if job.on_bad_line == "fail":
                raise UserError(
                    f"{job.corpus}, line {line_no}: the line {bad}. The '{objective.name}' objective "
                    f"reads {objective.corpus_format}. Fix the line, or set data.on_bad_line=skip "
                    f"to skip such lines.") from None
            skipped.append((line_no, str(bad)))
    rng = np.random.default_rng([job.seed, chunk.index])
    return _ChunkResult(chunk.index, chunk.num_bytes, objective.build(items, rng), skipped, objective.take_notes())


# The job of a worker process, set once by the pool initializer: sending the objective (with its
# tokenizer) with every chunk would pickle the vocabulary thousands of times.
_WORKER_JOB: _Job | None = None


def _init_worker(job: _Job, parent_alive: Connection | None = None) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job
    if parent_alive is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_alive,), daemon=True).start()


def _exit_with_parent(parent_alive: Connection) -> None:
    """Block until the main process is gone, then end this worker.

    A worker is a child of the forkserver, not of the main process, and holds the pipe that keeps
    the forkserver alive: when the main process is killed (kill -9 gives it no chance to shut the
    pool down) the workers would wait for work forever, and the forkserver with them. The main
    process holds the only write end of ``parent_alive`` and never writes: reading gets EOF exactly
    when it has exited, however it ended (no pid polling, so neither zombies nor reused pids fool it).
    """
    try:
        parent_alive.recv()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _work(chunk: Chunk) -> _ChunkResult:
    assert _WORKER_JOB is not None, "worker used before initialisation"
    return _run_chunk(_WORKER_JOB, chunk)


def _results(job: _Job, chunks: Iterable[Chunk], workers: int) -> Iterator[_ChunkResult]:
    """Chunk results in chunk order, computed by ``workers`` processes (in-process for 1)."""
    if workers <= 1:
        for chunk in chunks:
            yield _run_chunk(job, chunk)
        return
    # Workers must not be forked from this process (its torch/tokenizers threads could leave
    # locks held in the child). A forkserver forks them from a clean server that imports, once,
    # the modules a worker needs to unpickle its job (and is reused by later pools); where there
    # is none, spawn. None of these modules imports torch, which would add seconds to the
    # start of every pool and hundreds of MB to every worker.
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        preload = [__name__, type(job.objective).__module__]
        if job.objective.tokenizer is not None:
            preload.append(type(job.objective.tokenizer).__module__)
        context.set_forkserver_preload(preload)
    else:
        context = multiprocessing.get_context("spawn")
    # The bounded deque is the backpressure that keeps memory independent of corpus size.
    alive_read, alive_write = context.Pipe(duplex=False)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                               initargs=(job, alive_read))
    pending: deque[Future[_ChunkResult]] = deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(_work, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        alive_write.close()
        alive_read.close()


class _LabelInterner:
    """Gives string labels provisional ids while streaming; the final map is fixed at the end."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def intern(self, labels: list[str]) -> np.ndarray:
        return np.array([self.ids.setdefault(x, len(self.ids)) for x in labels], dtype=np.int64)

    def finish(self, directory: Path, shards: list[dict[str, Any]], corpus: Path) -> LabelMap:
        """The final label map; rewrites the stored provisional ids in place, block by block."""
        final = LabelMap.from_labels(self.ids, where=f"corpus {corpus}")
        remap = np.zeros(len(self.ids), dtype=np.int64)
        for label, provisional in self.ids.items():
            remap[provisional] = final.encode(label, "<corpus>", 0)
        for shard in shards:
            path = directory / shard["fields"]["label"]
            if shard["num_instances"] == 0:
                continue
            stored = np.memmap(path, dtype=FIELD_DTYPE, mode="r+")
            for begin in range(0, len(stored), 1 << 20):
                block = stored[begin:begin + (1 << 20)]
                block[:] = remap[block]
            stored.flush()
            del stored
        return final


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise UserError(f"output {output} exists and is a file; data.output must name a new "
                        f"directory.")
    if output.is_dir() and any(output.iterdir()):
        raise UserError(f"output directory {output} already exists and is not empty; choose a new "
                        f"data.output or remove it (preprocess never overwrites a dataset).")


PARTIAL_LOCK = ".lock"
UNLOCKED_PARTIAL_AGE_S = 600  # a partial directory without its lock file this old is abandoned


def _lock_partial(directory: Path) -> int | None:
    """Hold an exclusive lock on a partial dataset directory while it is being written (the kernel
    drops it when this process ends, however it ends); the file descriptor, or None without fcntl."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    fd = os.open(directory / PARTIAL_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _remove_abandoned_partials(output: Path) -> None:
    """Delete the ``.NAME.*.partial`` directories of killed earlier runs for the same output (those
    whose lock nobody holds); a running preprocess keeps its own."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    for partial in output.parent.glob(f".{output.name}.*.partial"):
        if not partial.is_dir() or partial.is_symlink():
            continue
        lock = partial / PARTIAL_LOCK
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:  # older version, or killed before the lock: judge by age
            if time.time() - partial.stat().st_mtime < UNLOCKED_PARTIAL_AGE_S:
                continue
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # being written right now
            finally:
                os.close(fd)
        shutil.rmtree(partial, ignore_errors=True)
        print(f"preprocess: removed {partial}, left by an interrupted earlier run", file=sys.stderr)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))


def preprocess(objective: Objective, tokenizer: Any, tokenizer_config: dict[str, Any],
               corpus: Path, output: Path, workers: int = 1,
               on_bad_line: Literal["fail", "skip"] = "fail", progress: bool = True, *,
               seed: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               max_shard_tokens: int = DEFAULT_SHARD_TOKENS) -> dict[str, Any]:
    """Tokenize ``corpus`` into a shard dataset at ``output``; returns the manifest.

    Args:
        objective: builds the instances (its tokenizer is the one used).
        tokenizer_config: the config that rebuilds the tokenizer, recorded in the manifest.
        workers: tokenizing processes (1 = in this process; never more than the corpus has chunks).
        on_bad_line: "fail" stops at the first bad line; "skip" skips and counts bad lines.
        progress: show a progress bar (bytes read) on stderr.
        seed: seeds instance construction (e.g. BERT's random next sentences).
        chunk_bytes: corpus bytes per work unit; part of what determines the output (as the
            objective's ``chunk_lines`` is, which ends a work unit of file-naming lines sooner).
        max_shard_tokens: a new shard file starts after this many tokens.
    """
    corpus, output = Path(corpus), Path(output)
    size = check_corpus(corpus)
    _check_output(output)
    raw_first, header_bytes = first_line(corpus)
    try:
        text_first = decode_line(raw_first, 1)
    except BadLine as bad:
        if on_bad_line == "fail":
            raise UserError(f"{corpus}, line 1: the line {bad}. Fix it, or set "
                            f"data.on_bad_line=skip to skip such lines.") from None
        text_first = raw_first.decode("utf-8", errors="replace").rstrip("\r\n")
    context, consumed = objective.begin_corpus(text_first, corpus)
    job = _Job(objective, context, str(corpus), on_bad_line, seed)
    output.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_partials(output)
    tmp = temporary_dir(output.parent, f".{output.name}.", ".partial")
    lock = _lock_partial(tmp)
    try:
        manifest = _write_dataset(job, tokenizer, corpus, size, tmp, workers, progress,
                                  chunk_bytes, max_shard_tokens, skip=int(consumed),
                                  header_bytes=header_bytes if consumed else 0)
        manifest.update(
            tokenizer=None if tokenizer is None else {
                "config": _jsonable(tokenizer_config), "fingerprint": tokenizer.fingerprint(),
                "vocab_size": int(tokenizer.vocab_size)},
            corpus={"path": str(corpus.resolve()), "size": size,
                    "format": objective.corpus_format},
            seed=seed, chunk_bytes=chunk_bytes, chunk_lines=objective.chunk_lines,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        write_manifest(tmp, manifest)
        if output.is_dir():
            output.rmdir()  # checked empty above; rename needs the name free
        (tmp / PARTIAL_LOCK).unlink(missing_ok=True)
        tmp.rename(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)
    return manifest


def _write_dataset(job: _Job, tokenizer: Any, corpus: Path, size: int, directory: Path,
                   workers: int, progress: bool, chunk_bytes: int, max_shard_tokens: int,
                   skip: int, header_bytes: int) -> dict[str, Any]:
    """Stream the corpus through the workers into shards in ``directory``; the manifest body."""
    from tqdm.auto import tqdm

    objective = job.objective
    vocab = 0 if tokenizer is None else int(tokenizer.vocab_size)  # no tokenizer: instances hold no tokens
    target_vocab = getattr(job.objective, "target_tokenizer", tokenizer)
    target_vocab = vocab if target_vocab is None else int(target_vocab.vocab_size)
    # ids beyond the tokenizer's (dalle: the image tokens after the text vocabulary)
    target_vocab = max(target_vocab, int(getattr(objective, "stored_vocab_size", 0)))
    writer = ShardWriter(directory, token_dtype_for(max(vocab, target_vocab)),
                         objective.field_names, max_shard_tokens, objective.array_specs())
    window, stride = objective.window
    carry = np.zeros(0, dtype=np.int64)
    labels = _LabelInterner()
    has_labels = False
    skipped: list[tuple[int, str]] = []
    num_skipped = 0
    notes: Counter[str] = Counter()
    boundary = is_blank if objective.documents_end_at_blank_lines else None
    chunk_lines = objective.chunk_lines
    chunks = read_chunks(corpus, chunk_bytes, boundary, skip_lines=skip, chunk_lines=chunk_lines)
    with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
              desc=f"preprocess {corpus.name}", disable=not progress) as bar:
        bar.update(header_bytes)
        # More processes than chunks would only add start-up time (a corpus of one chunk is done
        # in-process); the output does not depend on the number of workers.
        num_chunks = -(-size // chunk_bytes)
        if chunk_lines is not None and workers > num_chunks:  # chunks by lines: count them (a list file is small)
            num_chunks = max(num_chunks, -(-(count_lines(corpus) - skip) // chunk_lines))
        workers = min(workers, num_chunks)
        for result in _results(job, chunks, workers):
            notes.update(result.notes)
            num_skipped += len(result.skipped)
            skipped.extend(result.skipped[:MAX_REPORTED_SKIPS - len(skipped)])
            out = result.output
            if objective.packs:
                out, carry = windows(np.concatenate([carry, out]), window, stride, final=False)
            if out.labels is not None:
                has_labels = True
                out.fields["label"] = labels.intern(out.labels)
            writer.write(out)
            bar.update(result.num_bytes)
    if objective.packs:
        writer.write(windows(carry, window, stride, final=True)[0])
    shards = writer.close()
    for note, count in sorted(notes.items()):
        print(f"preprocess: {corpus}: {note}: {count} line(s)", file=sys.stderr)
    if num_skipped:
        first = ", ".join(f"line {n}: {why}" for n, why in skipped[:3])
        print(f"preprocess: skipped {num_skipped} bad line(s) of {corpus} ({first}"
              f"{', ...' if num_skipped > 3 else ''})", file=sys.stderr)
    if writer.num_instances == 0:
        note = f" ({num_skipped} line(s) were skipped as bad)" if num_skipped else ""
        raise UserError(f"corpus {corpus} produced no instances for objective '{objective.name}'"
                        f"{note}; it reads {objective.corpus_format}.")
    extra = objective.manifest_extra()
    if has_labels:
        extra["label_map"] = labels.finish(directory, shards, corpus).to_dict()
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "objective": {"name": objective.name, "config": objective.cfg.model_dump(mode="json"),
                      "instance_options": objective.instance_options()},
        "seq_length": objective.seq_length,
        "num_instances": writer.num_instances, "num_tokens": writer.num_tokens,
        "token_dtype": writer.token_dtype.str, "fields": {f: FIELD_DTYPE.str for f in writer.field_names},
        **({"arrays": writer.arrays} if writer.arrays else {}),
        "shards": shards,
        "skipped_lines": {"count": num_skipped,
                          "examples": [{"line": n, "reason": why} for n, why in skipped]},
        **({"notes": dict(sorted(notes.items()))} if notes else {}),
        **extra,
    }
