"""Opening a preprocessed dataset and streaming resumable pre-training batches from it.

Batch ``i`` of a run is a pure function of ``(seed, i)``: it belongs to epoch
``i // batches_per_epoch``, takes its instances from that epoch's permutation
(``np.random.default_rng([seed, epoch])``) and masks them with
``np.random.default_rng([seed, epoch, i])``. Resuming at batch ``k`` therefore gives exactly the
batches an uninterrupted run would have seen from ``k`` on, with any number of DataLoader
workers. With a curriculum (``train.curriculum``, :mod:`pentad.data.curriculum`) batch ``i`` is then
cut to the length of its step, also a pure function of ``i``, and with ``shortest_first`` the first
epoch's order starts with the shortest instances (:func:`shortest_first`, a function of the seed
too). The incomplete last batch of an epoch is dropped (its instances come first in some later
epoch's permutation with high probability; nothing is dropped from the dataset itself).
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from pentad.components.base import Batch
from pentad.data.curriculum import LengthSchedule, truncate
from pentad.data.objectives.base import Objective
from pentad.data.shards import ShardDataset, read_manifest
from pentad.errors import UserError


def open_dataset(path: Path, tokenizer: Any, objective: Objective) -> ShardDataset:
    """Open a dataset written by ``preprocess`` after checking it fits this run.

    UserError when the directory or manifest is missing or damaged, when it was built for another
    objective or with other instance options (e.g. seq_length), or with another tokenizer.
    """
    path = Path(path)
    manifest = read_manifest(path)
    built = manifest.get("objective", {})
    if built.get("name") != objective.name:
        raise UserError(f"dataset {path} was preprocessed for objective '{built.get('name')}', but "
                        f"this run's objective is '{objective.name}'; preprocess the corpus again "
                        f"with objective.type={objective.name} or change the objective.")
    stored = built.get("instance_options", {})
    wanted = objective.instance_options()
    differ = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
    if differ:
        both = "; ".join(f"objective.{k}: dataset {stored.get(k)!r}, config {wanted.get(k)!r}"
                         for k in differ)
        raise UserError(f"dataset {path} was preprocessed with other objective options ({both}); "
                        f"preprocess again or use the dataset's values.")
    built_tok = manifest.get("tokenizer") or {}
    if not objective.needs_tokenizer and tokenizer is None:
        return ShardDataset(path, manifest)  # instances without text (vit)
    if tokenizer is None:
        raise UserError(f"tokenizer is not set: objective '{objective.name}' needs the tokenizer dataset {path} was "
                        f"made with ({built_tok.get('config')})")
    if built_tok.get("fingerprint") != tokenizer.fingerprint():
        theirs, ours = built_tok.get("config"), _config_of(tokenizer)
        if isinstance(theirs, dict) and isinstance(ours, dict):
            # the dataset records the tokenizer section as it was given (defaults left out): compare what it says
            keys = [k for k in sorted(theirs) if theirs.get(k) != ours.get(k)]
            what = ("; ".join(f"tokenizer.{k}: dataset {theirs.get(k)!r}, config {ours.get(k)!r}" for k in keys)
                    if keys else "the same settings, but the vocabulary files' contents differ")
        else:
            what = f"dataset {theirs}, config {ours}"
        raise UserError(
            f"dataset {path} was tokenized with a different tokenizer ({what}). Leave the tokenizer out "
            f"of the config (a run takes the dataset's), use the dataset's values, or preprocess again.")
    return ShardDataset(path, manifest)


def _config_of(tokenizer: Any) -> Any:
    config = getattr(tokenizer, "config", None)
    config = config() if callable(config) else config
    return config.model_dump(mode="json") if hasattr(config, "model_dump") else repr(tokenizer)


class PretrainBatches:
    """The endless, resumable stream of pre-training batches over a ShardDataset.

    Batch ``i`` is the same whatever the number of processes: in a distributed run every rank
    makes it and trains on its own rows (``pentad.training.trainer.Trainer``), so masks and other
    random choices are those of a single process.
    """

    def __init__(self, dataset: ShardDataset, objective: Objective, batch_size: int, seed: int,
                 num_workers: int = 0, lengths: LengthSchedule | None = None, shortest_first: int = 0):
        if batch_size < 1:
            raise UserError(f"batch size must be at least 1 (received {batch_size}).")
        self.dataset = dataset
        self.objective = objective
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.lengths = lengths  # train.curriculum: batch i cut to lengths.length_of_batch(i) positions
        # train.curriculum.shortest_first, in instances: epoch 0 starts with the shortest ones, in increasing length
        self.shortest_first = shortest_first
        self.batches_per_epoch = len(dataset) // batch_size
        if self.batches_per_epoch == 0:
            raise UserError(f"dataset {dataset.directory} has {len(dataset)} instances, fewer than "
                            f"one batch ({batch_size}); use a smaller batch size or a larger corpus.")
        self._epoch = -1
        self._permutation = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        """Batches per epoch (the stream itself is endless)."""
        return self.batches_per_epoch

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:  # cached: consecutive batches share an epoch
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))
            if epoch == 0 and self.shortest_first:
                order = shortest_first(order, self.dataset.instance_lengths(), self.shortest_first)
            self._permutation = order
            self._epoch = epoch
        return self._permutation

    def indices(self, i: int) -> np.ndarray:
        """The dataset indices of batch ``i``."""
        epoch, step = divmod(i, self.batches_per_epoch)
        begin = step * self.batch_size
        return self._order(epoch)[begin:begin + self.batch_size]

    def batch(self, i: int) -> Batch:
        """Batch ``i`` (0-based count of batches since the start of training)."""
        epoch = i // self.batches_per_epoch
        batch = self.objective.collate(self.dataset.take(self.indices(i)),
                                       np.random.default_rng([self.seed, epoch, i]))
        return batch if self.lengths is None else truncate(batch, self.lengths.length_of_batch(i))

    def __getitem__(self, i: int) -> Batch:
        return self.batch(int(i))

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches ``start, start+1, ...`` forever (``start`` = batches already consumed)."""
        yield from iterate_batches(self, start, self.num_workers, self.seed)


def iterate_batches(batches: Any, start: int, num_workers: int, seed: int) -> Iterator[Batch]:
    """``batches[start], batches[start + 1], ...`` forever, where ``batches[i]`` builds batch ``i`` as a pure
    function of ``i``: in this process (``num_workers`` 0) or in that many DataLoader worker processes,
    which give the same batches in the same order. ``seed`` seeds the loader's own generator."""
    if num_workers <= 0:
        for i in itertools.count(start):
            yield batches[i]
        return
    loader = DataLoader(
        batches, batch_size=None, sampler=_CountFrom(start), num_workers=num_workers,
        collate_fn=_identity, worker_init_fn=_ignore_stop_signals,
        # its own generator: the base seed it draws for its workers must not come from the
        # global RNG, whose state (dropout) a checkpoint restores; batches do not use it
        generator=torch.Generator().manual_seed(seed))
    yield from loader


def shortest_first(order: np.ndarray, lengths: np.ndarray, count: int) -> np.ndarray:
    """``order`` (a permutation of the instances) with its ``count`` shortest instances moved to the front in
    increasing length, ties kept in ``order``'s order; the others follow in ``order``'s order."""
    ranked = np.argsort(lengths[order], kind="stable")[:count]  # positions in ``order``
    rest = np.ones(len(order), dtype=bool)
    rest[ranked] = False
    return np.concatenate([order[ranked], order[rest]])


class _CountFrom(Sampler):
    """Batch indices ``start, start+1, ...``, endlessly."""

    def __init__(self, start: int):
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.count(self.start)


def _ignore_stop_signals(worker_id: int) -> None:
    """Loader workers leave SIGINT/SIGTERM to the main process, which stops at a step boundary with a
    checkpoint and then ends them: Ctrl-C reaches every process of the terminal's process group, and
    a worker that died of it (or ran a copy of the trainer's handler) would break or clutter that stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _identity(batch: Batch) -> Batch:
    return batch
