"""Multi-label classification: TSV ``label<TAB>text_a[<TAB>text_b]`` whose label is a comma-separated
set -> ``multi_label`` head (one sigmoid per label, binary cross-entropy).

The format is TencentPretrain's ``run_classifier_multi_label``: ``0,2`` gives an example the labels
0 and 2. Labels are ids ``0..n-1`` when every label is an integer, otherwise the sorted distinct
names (``LOC,PER``), as for classification. An empty label field is an example with no label at
all (TencentPretrain's inference writes such an example so; its training reader has no way to say
it). A prediction is every label whose probability exceeds ``task.threshold``.

Metrics: ``micro_f1`` (F1 of the (example, label) decisions pooled over all labels), ``macro_f1``
(the mean of each label's F1; a label neither present nor predicted in the file is left out) and
``subset_accuracy`` (the share of examples whose predicted set is exactly the gold set, the
accuracy TencentPretrain reports). An F1 with nothing present and nothing predicted is 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig
from pentad.tasks.texts import TextExamples, collate_texts, line_numbers, predict_texts, text_objective


class MultiLabelTaskConfig(TaskConfig):
    type: Literal["multi_label"] = "multi_label"
    num_labels: int | None = Field(None, ge=1, description="with integer labels: the number of label ids "
                                   "(default: the labels found in the training set, which must be 0..n-1)")
    threshold: float = Field(0.5, gt=0.0, lt=1.0, description="a label is predicted when its probability "
                             "exceeds this")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["micro_f1", "macro_f1", "subset_accuracy"] = Field(
        "micro_f1", description="dev metric that picks the best model")


def split_labels(field: str, path: Path | str, line: int) -> list[str]:
    """The label names of one label field (comma-separated; empty: no label)."""
    if not field.strip():
        return []
    names = [name.strip() for name in field.split(",")]
    if "" in names:
        raise UserError(f"{path}, line {line}: the label field {field!r} has an empty label (two commas in a "
                        "row, or a comma at either end); separate labels with single commas, or leave the field "
                        "empty for an example with no label.")
    return list(dict.fromkeys(names))


def multi_label_metrics(predicted: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """micro-F1, macro-F1 and subset accuracy of 0/1 decisions ``predicted`` [N, L] against ``gold`` [N, L]
    (see the module docstring)."""
    p, g = np.asarray(predicted, dtype=bool), np.asarray(gold, dtype=bool)
    if p.shape != g.shape:
        raise ValueError(f"predictions {p.shape} and gold labels {g.shape} differ in shape")
    tp, fp, fn = (p & g).sum(0), (p & ~g).sum(0), (~p & g).sum(0)
    micro_den = 2 * tp.sum() + fp.sum() + fn.sum()
    seen = (tp + fp + fn) > 0
    per_label = 2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])
    return {"micro_f1": float(2 * tp.sum() / micro_den) if micro_den else 0.0,
            "macro_f1": float(per_label.mean()) if seen.any() else 0.0,
            "subset_accuracy": float((p == g).all(axis=1).mean()) if len(g) else 0.0}


@TASKS.register("multi_label")
class MultiLabelTask(Task):
    """Multi-label classification (any number of labels per text or pair): a sigmoid per label."""

    Config = MultiLabelTaskConfig
    head = "multi_label"
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.multi_label"})
    input_format = "label<TAB>text_a[<TAB>text_b], label: comma-separated labels (empty: none)"
    metric_names = ("micro_f1", "macro_f1", "subset_accuracy")

    def __init__(self, cfg: MultiLabelTaskConfig, tokenizer, seq_length: int, state=None):
        self.label_map = None
        self.objective = text_objective(tokenizer, seq_length)
        super().__init__(cfg, tokenizer, seq_length, state)

    def _rows(self, path: Path, with_labels: bool):
        from pentad.data.tsv import read_classification_tsv

        return read_classification_tsv(path, with_labels=with_labels, empty_label=True,
                                       expected="label<TAB>text_a[<TAB>text_b]" if with_labels else None)

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train_path: Path) -> None:
        """The label map from the training file's labels (ids 0..n-1 if every label is an integer)."""
        from pentad.data.tsv import LabelMap, TsvRow

        rows, _ = self._rows(train_path, with_labels=True)
        # one row per (line, label), so the label map's checks name the line of a bad label
        occurrences = [TsvRow(r.line, "", label=name) for r in rows
                       for name in split_labels(r.label or "", train_path, r.line)]
        if not occurrences:
            raise UserError(f"{train_path}: no example has a label (every label field is empty); a multi-label "
                            "training set needs examples of its labels.")
        self.label_map = LabelMap.from_rows(occurrences, train_path, num_labels=self.cfg.num_labels)

    def state(self) -> dict[str, Any]:
        return self.label_map.to_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        from pentad.data.tsv import LabelMap

        self.label_map = LabelMap.from_dict(state)

    def describe(self) -> str:
        return f"{self.num_labels} labels {self.label_map.names}, threshold {self.cfg.threshold}"

    @property
    def num_labels(self) -> int:
        return self.label_map.num_labels

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "multi_label", "num_labels": self.num_labels, "pooling": self.cfg.pooling,
                 "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- data
    def read(self, path: Path, with_labels: bool = True) -> TextExamples:
        """The examples of a TSV file; with labels, targets [N, num_labels] 0/1 (float32)."""
        rows, columns = self._rows(path, with_labels)
        return self._encode(rows, columns, path, with_labels)

    def read_windows(self, path: Path, window: int):
        from pentad.data.tsv import iter_classification_tsv

        return (self._encode(rows, columns, path, False)
                for rows, columns in iter_classification_tsv(path, False, empty_label=True, window=window))

    def _encode(self, rows, columns, path: Path, with_labels: bool) -> TextExamples:
        from pentad.data.tsv import encode_classification

        inputs = encode_classification(rows, self.tokenizer, self.seq_length, None, path=path)
        targets = None
        if with_labels and "label" in columns:
            targets = np.zeros((len(rows), self.num_labels), dtype=np.float32)
            for i, row in enumerate(rows):
                for name in split_labels(row.label or "", path, row.line):
                    targets[i, self.label_map.encode(name, path, row.line)] = 1.0
        return TextExamples(inputs, targets, None if targets is None else targets > 0.5, line_numbers(rows))

    def collate(self, instances: TextExamples, indices, rng: np.random.Generator):
        return collate_texts(self.objective, instances, indices, rng, self.head)

    def gold(self, instances: TextExamples) -> np.ndarray:
        if instances.gold is None:
            raise UserError("the evaluation file has no labels (a 'label' column).")
        return instances.gold

    # ---------------------------------------------------------------- evaluation and output
    def predict(self, model, instances: TextExamples, batch_size: int, device,
                progress: str | None = None) -> torch.Tensor:
        """The head's logits [N, num_labels]."""
        return predict_texts(self.objective, instances, self.head, model, batch_size, device, progress)

    def decide(self, logits: torch.Tensor) -> np.ndarray:
        """0/1 decisions [N, num_labels]: probability above ``task.threshold``."""
        return (torch.sigmoid(logits.float()) > self.cfg.threshold).numpy()

    def score(self, predictions: torch.Tensor, instances: TextExamples, gold: np.ndarray) -> dict[str, float]:
        return multi_label_metrics(self.decide(predictions), gold)

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``label``: each example's predicted labels joined by commas (empty: none), and on
        request one ``prob_<label>`` column per label (its sigmoid probability)."""
        return "\t".join(["label"] + ([f"prob_{n}" for n in self.label_map.names] if probabilities else []))

    def prediction_lines(self, logits: torch.Tensor, instances: TextExamples, probabilities: bool) -> list[str]:
        names = list(self.label_map.names)
        probs = torch.sigmoid(logits.float()).numpy()
        lines = []
        for decisions, row in zip(self.decide(logits), probs):
            cols = [",".join(n for n, on in zip(names, decisions) if on)]
            lines.append("\t".join(cols + ([f"{x:.6f}" for x in row] if probabilities else [])))
        return lines
