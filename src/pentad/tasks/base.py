"""What every downstream task shares: batching in-memory instances, evaluation, metrics."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from pentad.components.base import Batch


class Task:
    """A downstream task: reads its files, names its head, evaluates and writes predictions.

    ``provides``: the Batch fields its batches fill (as for objectives), checked against the model.
    """

    registry_name: ClassVar[str]
    provides: ClassVar[frozenset[str]] = frozenset()

    def head_configs(self) -> list[dict[str, Any]]:  # pragma: no cover - abstract
        """The target configs of the task's head(s), replacing the pre-training targets."""
        raise NotImplementedError

    def gold(self, instances: Any) -> Any:
        """The reference answers of read instances, in the form ``evaluate`` takes (default: the
        ``label`` field, one class id per instance)."""
        return np.asarray(instances.fields["label"], dtype=np.int64)


class EpochBatches:
    """Batches over ``n`` in-memory instances, reshuffled each epoch with a seeded permutation.

    ``iterate(start)`` yields batches from micro-batch ``start`` on, exactly as an uninterrupted
    run would; the last, smaller batch of an epoch is kept (no example is dropped).
    """

    def __init__(self, n: int, batch_size: int, seed: int,
                 collate: Callable[[Sequence[int], np.random.Generator], Batch]):
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.collate = collate
        self.batches_per_epoch = math.ceil(n / batch_size)

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        i = start
        while True:
            epoch, pos = divmod(i, self.batches_per_epoch)
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            rows = order[pos * self.batch_size:(pos + 1) * self.batch_size]
            yield self.collate(rows, np.random.default_rng([self.seed, epoch, pos]))
            i += 1


def in_order(n: int, batch_size: int, progress: str | None = None) -> Iterator[np.ndarray]:
    """Index batches ``0..n-1`` in order; ``progress``: show a bar (examples) on stderr with this label."""
    from tqdm import tqdm

    with tqdm(total=n, desc=progress, unit="ex", disable=progress is None, leave=False, file=sys.stderr,
              dynamic_ncols=True) as bar:
        for begin in range(0, n, batch_size):
            yield np.arange(begin, min(n, begin + batch_size))
            bar.update(min(n, begin + batch_size) - begin)


def classification_metrics(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """Accuracy and macro-F1 (the unweighted mean of per-class F1; a class never predicted nor
    present is left out of the mean)."""
    accuracy = float((predictions == labels).mean()) if len(labels) else 0.0
    f1s = []
    for c in range(num_labels):
        tp = int(((predictions == c) & (labels == c)).sum())
        fp = int(((predictions == c) & (labels != c)).sum())
        fn = int(((predictions != c) & (labels == c)).sum())
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": accuracy, "macro_f1": float(np.mean(f1s)) if f1s else 0.0}


@torch.no_grad()
def predict_logits(model: torch.nn.Module, batches: Iterator[Batch], head: str, device: torch.device
                   ) -> torch.Tensor:
    """Concatenated logits of ``head`` over ``batches``, in order (eval mode, no labels needed)."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for batch in batches:
            batch = batch.to(device)
            batch.labels = {}
            out.append(model(batch)[head].logits.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)
