"""What the sentence(-pair) tasks whose labels are not one class id share (multi-label, regression,
ranking): encoded texts with the head's targets beside them, batched through the ``cls`` objective."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pentad.components.base import Batch
from pentad.data.shards import Instances
from pentad.registry import OBJECTIVES
from pentad.tasks.base import in_order, predict_logits


@dataclass
class TextExamples:
    """Encoded rows of a TSV file.

    inputs: ``[CLS] a [SEP] (b [SEP])`` per row with its ``split`` field (and ``label``, class ids,
    when the head is a ``cls`` head); targets: the head's labels, one row per example (e.g. [N, L]
    0/1 for multi-label, [N] standardised values for regression), or None; gold: the reference
    answers as :meth:`Task.score` takes them, or None without labels; lines: each row's line in
    its file (1-based, header = 1); groups: a group id per row (a ranking task's question ids).
    """

    inputs: Instances
    targets: np.ndarray | None
    gold: Any
    lines: np.ndarray
    groups: list[str] | None = None

    def __len__(self) -> int:
        return len(self.inputs)


def text_objective(tokenizer: Any, seq_length: int) -> Any:
    """The ``cls`` objective, whose collate batches the inputs (tokens, segments, padding_mask)."""
    from pentad.data.objectives.cls import ClsObjectiveConfig

    return OBJECTIVES.get("cls")(ClsObjectiveConfig(seq_length=seq_length), tokenizer)


def collate_texts(objective: Any, examples: TextExamples, indices: Sequence[int], rng: np.random.Generator,
                  head: str) -> Batch:
    """The Batch of ``examples[indices]``; ``labels[head]`` from the targets when there are any."""
    chosen = np.asarray(indices, dtype=np.int64)
    batch = objective.collate(examples.inputs[chosen], rng)
    if examples.targets is not None:
        batch.labels[head] = torch.from_numpy(np.ascontiguousarray(examples.targets[chosen]))
    return batch


def predict_texts(objective: Any, examples: TextExamples, head: str, model: torch.nn.Module, batch_size: int,
                  device: torch.device, progress: str | None = None) -> torch.Tensor:
    """The head's outputs over all examples, in order ([N, ...] float, on the CPU)."""
    rng = np.random.default_rng(0)
    batches = (collate_texts(objective, examples, idx, rng, head) for idx in in_order(len(examples), batch_size,
                                                                                       progress))
    return predict_logits(model, batches, head, device)


def line_numbers(rows: Sequence[Any]) -> np.ndarray:
    return np.asarray([r.line for r in rows], dtype=np.int64)
