"""Regression: TSV ``label<TAB>text_a[<TAB>text_b]`` with a real-valued label -> ``regression`` head (one
output, mean squared error), as TencentPretrain's ``run_regression`` (STS-B style similarity scores).

With ``task.standardize`` (the default) the head learns ``(label - mean) / std`` of the training
labels; the mean and standard deviation are the task's state, and predictions are mapped back to the
labels' scale, so metrics and prediction files are in the data's units.

Metrics: ``pearson`` (the linear correlation of predictions and labels), ``spearman`` (Pearson's
correlation of their ranks, tied values given the average of their ranks, as ``scipy.stats.spearmanr``)
and ``mse`` (mean squared error, lower is better: the best model then has the lowest). A correlation
with a constant side is undefined and reported as 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig
from pentad.tasks.correlation import pearson, spearman
from pentad.tasks.texts import TextExamples, collate_texts, line_numbers, predict_texts, text_objective


class RegressionTaskConfig(TaskConfig):
    type: Literal["regression"] = "regression"
    standardize: bool = Field(True, description="the head learns standardised labels (the training set's mean "
                              "and standard deviation, kept in the run); predictions are on the labels' scale")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["pearson", "spearman", "mse"] = Field(
        "pearson", description="dev metric that picks the best model (mse: the lowest)")


# ------------------------------------------------------------------------------------ metrics
def regression_metrics(predicted: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Pearson, Spearman (``pentad.tasks.correlation``) and the mean squared error of ``predicted`` [N]."""
    p, g = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    return {"pearson": pearson(p, g), "spearman": spearman(p, g),
            "mse": float(((p - g) ** 2).mean()) if len(g) else 0.0}


def parse_value(label: str, path: Path | str, line: int) -> float:
    """A label field as a finite float; UserError naming the line otherwise."""
    try:
        value = float(label)
    except ValueError:
        raise UserError(f"{path}, line {line}: label {label!r} is not a number; a regression label is a real "
                        "value such as 3.5 or -0.25.") from None
    if not math.isfinite(value):
        raise UserError(f"{path}, line {line}: label {label!r} is not a finite number.")
    return value


# ------------------------------------------------------------------------------------ the task
@TASKS.register("regression")
class RegressionTask(Task):
    """Regression on a text or pair (similarity, rating): one output with a squared-error loss."""

    Config = RegressionTaskConfig
    head = "regression"
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.regression"})
    input_format = "label<TAB>text_a[<TAB>text_b], label: a real value"
    metric_names = ("pearson", "spearman", "mse")

    def __init__(self, cfg: RegressionTaskConfig, tokenizer, seq_length: int, state=None):
        self.mean, self.std = 0.0, 1.0
        self.objective = text_objective(tokenizer, seq_length)
        super().__init__(cfg, tokenizer, seq_length, state)

    def _values(self, path: Path, with_labels: bool) -> tuple[list[Any], np.ndarray | None]:
        from pentad.data.tsv import read_classification_tsv

        rows, columns = read_classification_tsv(path, with_labels=with_labels)
        if not (with_labels and "label" in columns):
            return rows, None
        return rows, np.array([parse_value(r.label or "", path, r.line) for r in rows], dtype=np.float64)

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train_path: Path) -> None:
        """The training labels' mean and standard deviation (with ``standardize``)."""
        _, values = self._values(train_path, with_labels=True)
        assert values is not None
        if len(values) < 2 or float(values.std()) == 0.0:
            raise UserError(f"{train_path}: every training label is {values[0]:g}; regression needs labels that "
                            "vary.")
        if self.cfg.standardize:
            self.mean, self.std = float(values.mean()), float(values.std())

    def state(self) -> dict[str, Any]:
        return {"kind": "regression", "mean": self.mean, "std": self.std}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "regression" or not {"mean", "std"} <= set(state):
            raise UserError(f"not a regression task's state: {str(state)[:80]!r} (expected kind 'regression' with "
                            "'mean' and 'std'); was the run fine-tuned for another task?")
        self.mean, self.std = float(state["mean"]), float(state["std"])

    def describe(self) -> str:
        if not self.cfg.standardize:
            return "labels as they are (not standardised)"
        return f"labels standardised with mean {self.mean:.4g} and std {self.std:.4g}"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "regression", "pooling": self.cfg.pooling, "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- data
    def read(self, path: Path, with_labels: bool = True) -> TextExamples:
        """The examples of a TSV file; with labels, targets [N] float32 (standardised) and gold [N] float64."""
        rows, values = self._values(path, with_labels)
        return self._encode(rows, values, path)

    def read_windows(self, path: Path, window: int):
        from pentad.data.tsv import iter_classification_tsv

        return (self._encode(rows, None, path) for rows, _ in iter_classification_tsv(path, False, window=window))

    def _encode(self, rows, values: np.ndarray | None, path: Path) -> TextExamples:
        from pentad.data.tsv import encode_classification

        inputs = encode_classification(rows, self.tokenizer, self.seq_length, None, path=path)
        targets = None if values is None else ((values - self.mean) / self.std).astype(np.float32)
        return TextExamples(inputs, targets, values, line_numbers(rows))

    def collate(self, instances: TextExamples, indices, rng: np.random.Generator):
        return collate_texts(self.objective, instances, indices, rng, self.head)

    def gold(self, instances: TextExamples) -> np.ndarray:
        if instances.gold is None:
            raise UserError("the evaluation file has no labels (a 'label' column).")
        return instances.gold

    # ---------------------------------------------------------------- evaluation and output
    def predict(self, model, instances: TextExamples, batch_size: int, device,
                progress: str | None = None) -> np.ndarray:
        """Predicted values [N] on the labels' scale."""
        out = predict_texts(self.objective, instances, self.head, model, batch_size, device, progress)
        return out.reshape(-1).double().numpy() * self.std + self.mean

    def score(self, predictions: np.ndarray, instances: TextExamples, gold: np.ndarray) -> dict[str, float]:
        return regression_metrics(predictions, gold)

    def selection_score(self, metrics: dict[str, float]) -> float:
        """``task.metric``, negated for mse (lower is better)."""
        value = float(metrics.get(self.cfg.metric, -math.inf if self.cfg.metric != "mse" else math.inf))
        return -value if self.cfg.metric == "mse" else value

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``label``: one predicted value per line (``probabilities`` adds nothing: a regression
        has none)."""
        return "label"

    def prediction_lines(self, predictions: np.ndarray, instances: TextExamples, probabilities: bool) -> list[str]:
        return [f"{float(v):.6g}" for v in predictions]
