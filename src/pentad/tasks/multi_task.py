"""Multi-task classification: several classification datasets in one run, one shared encoder and one
``cls`` head per dataset (``cls_<name>``), as TencentPretrain's ``run_classifier_mt.py``.

The datasets are listed in the task config (``data.train``/``dev``/``test`` stay unset)::

    task:
      type: multi_task
      datasets:
        - {name: sentiment, train: book_review/train.tsv, dev: book_review/dev.tsv}
        - {name: person, train: person/train.tsv, dev: person/dev.tsv, test: person/test.tsv}

Each file has the classification format (``label<TAB>text_a[<TAB>text_b]``); each dataset has its
own label map. Every training micro-batch comes from one dataset and carries labels for that
dataset's head only; the other heads return no loss for it (``TargetOutput.loss`` None), so the step
trains the shared encoder and that one head. ``task.sampling``:

- ``proportional`` (default, TencentPretrain's): each epoch every dataset is shuffled and cut into
  batches, and all the batches of all datasets are shuffled together; every example is seen once
  per epoch, and a dataset's share of the steps is its share of the examples.
- ``rotating``: the datasets take turns, one batch each; an epoch is as many rounds as the largest
  dataset has batches, so smaller datasets are repeated (each reshuffled whenever it is used up).

Evaluation scores each dataset's dev (test) file with its own head: ``<name>/accuracy`` and
``<name>/macro_f1``, and their means over the datasets ``mean_accuracy`` and ``mean_macro_f1``
(the default selection metric is ``mean_accuracy``). Inference reads one file
(``text_a[<TAB>text_b]``) and predicts it with every head: one label column per dataset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from pentad.components.base import Batch
from pentad.config.base import StrictModel
from pentad.data.loader import iterate_batches
from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, classification_metrics, in_order
from pentad.tasks.classification import ClassificationTask, ClassificationTaskConfig


class DatasetSpec(StrictModel):
    """One dataset of a multi-task run."""

    name: str = Field(pattern=r"^[A-Za-z0-9_]+$", description="names the head (cls_<name>), the metrics "
                      "(<name>/accuracy) and the prediction column; letters, digits and _")
    train: Path = Field(description="training TSV (label<TAB>text_a[<TAB>text_b])")
    dev: Path | None = Field(None, description="dev TSV (scored each evaluation)")
    test: Path | None = Field(None, description="test TSV (scored with the best model)")
    num_labels: int | None = Field(None, ge=2, description="default: the labels found in its training file")


class MultiTaskConfig(TaskConfig):
    type: Literal["multi_task"] = "multi_task"
    datasets: list[DatasetSpec] = Field(default_factory=list, description="the datasets, each {name, train, "
                                        "dev, test, num_labels}; one cls head each")
    sampling: Literal["proportional", "rotating"] = Field(
        "proportional", description="proportional: each epoch all batches of all datasets, shuffled together; "
        "rotating: one batch of each dataset in turn")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["mean_accuracy", "mean_macro_f1"] = Field(
        "mean_accuracy", description="dev metric that picks the best model (the mean over the datasets)")

    @field_validator("datasets")
    @classmethod
    def _unique_names(cls, datasets: list[DatasetSpec]) -> list[DatasetSpec]:
        names = [d.name for d in datasets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"dataset names must differ (they name the heads); repeated: {repeated}")
        return datasets


@dataclass
class MultiInstances:
    """Instances of several datasets, indexed as one concatenation (dataset after dataset); or, for
    inference, one file's instances that every head predicts (``names`` then lists every dataset and
    ``parts`` holds that one file)."""

    names: tuple[str, ...]
    parts: tuple[Any, ...]
    shared: bool = False

    @property
    def offsets(self) -> np.ndarray:
        return np.cumsum([0, *(len(p) for p in self.parts)])

    def __len__(self) -> int:
        return int(self.offsets[-1])


class MultiTaskBatches:
    """Training batches of a multi-task run, each from one dataset (see the module docstring for the
    two samplings); deterministic in (seed, micro-batch index), so a run resumes at any micro-batch."""

    def __init__(self, sizes: Sequence[int], batch_size: int, seed: int, sampling: str, collate):
        self.sizes = list(sizes)
        self.batch_size = batch_size
        self.seed = seed
        self.sampling = sampling
        self.collate = collate
        self.num_workers = 0
        self._epoch = -1
        self._plan: list[tuple[int, int, int]] = []
        self.offsets = np.cumsum([0, *self.sizes])
        self.counts = [math.ceil(n / batch_size) for n in self.sizes]
        if sampling == "proportional":
            self.batches_per_epoch = sum(self.counts)
        else:
            self.batches_per_epoch = max(self.counts) * len(self.sizes)

    def _rows(self, k: int, own_epoch: int, pos: int) -> np.ndarray:
        order = np.random.default_rng([self.seed, k, own_epoch]).permutation(self.sizes[k])
        return self.offsets[k] + order[pos * self.batch_size:(pos + 1) * self.batch_size]

    def plan(self, epoch: int) -> list[tuple[int, int, int]]:
        """(dataset, that dataset's epoch, batch position) of every batch of a global epoch, in order."""
        if self.sampling == "proportional":
            plan = [(k, epoch, pos) for k, count in enumerate(self.counts) for pos in range(count)]
            order = np.random.default_rng([self.seed, epoch]).permutation(len(plan))
            return [plan[i] for i in order]
        rounds = max(self.counts)
        plan = []
        for r in range(rounds):
            for k, count in enumerate(self.counts):
                own_epoch, pos = divmod(epoch * rounds + r, count)
                plan.append((k, own_epoch, pos))
        return plan

    def batch(self, i: int) -> Batch:
        """Micro-batch ``i`` (0-based, counted from the start of training)."""
        epoch, index = divmod(i, self.batches_per_epoch)
        if epoch != self._epoch:  # consecutive batches share an epoch's plan
            self._plan = self.plan(epoch)
            self._epoch = epoch
        k, own_epoch, p = self._plan[index]
        return self.collate(self._rows(k, own_epoch, p), np.random.default_rng([self.seed, epoch, index]))

    def __getitem__(self, i: int) -> Batch:
        return self.batch(int(i))

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches ``start, start + 1, ...``: in this process or in ``num_workers`` DataLoader workers
        (``data.loader_workers``), the same batches either way."""
        return iterate_batches(self, start, self.num_workers, self.seed)


@TASKS.register("multi_task")
class MultiTaskTask(Task):
    """Multi-task classification: several datasets, one shared encoder, a cls head and metrics per dataset."""

    Config = MultiTaskConfig
    input_format = "task.datasets: [{name, train, dev, test}], each label<TAB>text_a[<TAB>text_b]"
    named_inputs = True

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        raise UserError("train.folds (cross-validation) does not run multi_task, whose training data is several "
                        "files; cross-validate each dataset with the classification task, or fine-tune without "
                        "train.folds")
    metric_names = ("mean_accuracy", "mean_macro_f1", "<name>/accuracy", "<name>/macro_f1")

    def __init__(self, cfg: MultiTaskConfig, tokenizer, seq_length: int, state=None):
        self.names = tuple(d.name for d in cfg.datasets)
        self.tasks: dict[str, ClassificationTask] = {}
        for d in cfg.datasets:
            sub = ClassificationTaskConfig(num_labels=d.num_labels, pooling=cfg.pooling, head_dropout=cfg.head_dropout)
            self.tasks[d.name] = ClassificationTask(sub, tokenizer, seq_length)
        super().__init__(cfg, tokenizer, seq_length, state)

    @classmethod
    def sources(cls, cfg: MultiTaskConfig, data: Any) -> dict[str, Any]:
        """Each split as ``{dataset name: file}`` from ``task.datasets`` (a split no dataset has: None)."""
        if not cfg.datasets:
            raise UserError("multi_task: task.datasets is empty; list the datasets, e.g. task.datasets="
                            "'[{name: a, train: a/train.tsv, dev: a/dev.tsv}, {name: b, train: b/train.tsv}]'")
        given = [k for k in ("train", "dev", "test") if getattr(data, k) is not None]
        if given:
            raise UserError(f"multi_task reads its files from task.datasets, but data.{given[0]} is set "
                            f"({getattr(data, given[0])}); give each dataset's train/dev/test files in "
                            "task.datasets and leave data.train, data.dev and data.test unset")
        out: dict[str, Any] = {}
        for split in ("train", "dev", "test"):
            files = {d.name: getattr(d, split) for d in cfg.datasets if getattr(d, split) is not None}
            out[split] = files or None
        return out

    def bind(self, run_cfg: Any) -> None:
        if getattr(run_cfg.train, "strategy", "single") == "ddp":
            raise UserError("multi_task does not run under train.strategy=ddp: each batch trains one dataset's "
                            "head only, and DDP requires every parameter to take part in every step; use "
                            "train.strategy=single")

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train: dict[str, Path]) -> None:
        for name, path in train.items():
            self.tasks[name].fit(path)

    def state(self) -> dict[str, Any]:
        return {"datasets": [{"name": n, "labels": t.state()} for n, t in self.tasks.items()]}

    def load_state(self, state: dict[str, Any]) -> None:
        saved = {d["name"]: d["labels"] for d in state.get("datasets", [])}
        if set(saved) != set(self.tasks):
            raise UserError(f"the run's task state names the datasets {sorted(saved)}, but task.datasets names "
                            f"{sorted(self.tasks)}; infer with the run's own config")
        for name, labels in saved.items():
            self.tasks[name].load_state(labels)

    def describe(self) -> str:
        return "; ".join(f"{n}: {t.describe()}" for n, t in self.tasks.items())

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "cls", "name": f"cls_{n}", "num_labels": t.num_labels, "pooling": self.cfg.pooling,
                 "dropout": self.cfg.head_dropout} for n, t in self.tasks.items()]

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"tokens", "segments", "padding_mask", *(f"labels.cls_{n}" for n in self.names)})

    # ---------------------------------------------------------------- data
    # inference reads its input whole (no read_windows): several datasets' files, each a column of one output
    def read(self, source: dict[str, Path] | Path, with_labels: bool = True) -> MultiInstances:
        """``{name: file}`` (a split of the datasets, each with its own labels), or one file that every
        head predicts (inference)."""
        if isinstance(source, dict):
            names = tuple(source)
            unknown = [n for n in names if n not in self.tasks]
            if unknown:
                raise UserError(f"multi_task has no dataset named '{unknown[0]}' (data.test.{unknown[0]}); its "
                                f"datasets are {', '.join(self.names)}")
            return MultiInstances(names, tuple(self.tasks[n].read(source[n], with_labels) for n in names))
        if with_labels:  # (fine-tuning reads {name: file}; one file with labels is an evaluation input)
            raise UserError(f"{source}: multi_task reads labelled input as one file per dataset "
                            f"({', '.join(self.names)}), each scored by that dataset's head, not one file for all "
                            "(pentad evaluate: data.test.NAME=FILE for each dataset to score)")
        first = self.tasks[self.names[0]]
        return MultiInstances(self.names, (first.read(source, with_labels=False),), shared=True)

    def _locate(self, instances: MultiInstances, indices: Sequence[int]) -> tuple[int, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        if instances.shared:
            return 0, idx
        part = np.searchsorted(instances.offsets, idx, side="right") - 1
        if len(idx) and (part != part[0]).any():
            raise ValueError("a multi-task batch mixes datasets; its batches come from train_batches")
        k = int(part[0]) if len(idx) else 0
        return k, idx - instances.offsets[k]

    def collate(self, instances: MultiInstances, indices, rng: np.random.Generator):
        """The rows of one dataset, labels under that dataset's head (``cls_<name>``) only."""
        k, rows = self._locate(instances, indices)
        name = instances.names[k]
        batch = self.tasks[name].collate(instances.parts[k], rows, rng)
        label = batch.labels.pop("cls", None)
        batch.labels = {} if instances.shared or label is None else {f"cls_{name}": label}
        return batch

    def train_batches(self, instances: MultiInstances, batch_size: int, seed: int) -> MultiTaskBatches:
        return MultiTaskBatches([len(p) for p in instances.parts], batch_size, seed, self.cfg.sampling,
                                lambda idx, rng: self.collate(instances, idx, rng))

    def gold(self, instances: MultiInstances) -> dict[str, np.ndarray]:
        return {n: np.asarray(p.fields["label"], dtype=np.int64) for n, p in zip(instances.names, instances.parts)}

    # ---------------------------------------------------------------- prediction and evaluation
    @torch.no_grad()
    def predict(self, model, instances: MultiInstances, batch_size: int, device, progress: str | None = None
                ) -> dict[str, torch.Tensor]:
        """Logits [N, num_labels] per dataset: of its own file (evaluation), or of the one inference file."""
        was_training = model.training
        model.eval()
        out: dict[str, list[torch.Tensor]] = {n: [] for n in instances.names}
        rng = np.random.default_rng(0)
        try:
            for k, part in enumerate(instances.parts):
                heads = instances.names if instances.shared else (instances.names[k],)
                for rows in in_order(len(part), batch_size, progress):
                    batch = self.tasks[heads[0]].collate(part, rows, rng).to(device)
                    batch.labels = {}
                    outputs = model(batch)
                    for name in heads:
                        out[name].append(outputs[f"cls_{name}"].logits.float().cpu())
        finally:
            model.train(was_training)
        return {n: torch.cat(v) if v else torch.empty(0) for n, v in out.items()}

    def score(self, predictions: dict[str, torch.Tensor], instances, gold: dict[str, np.ndarray]
              ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, labels in gold.items():
            got = classification_metrics(predictions[name].argmax(-1).numpy(), labels, self.tasks[name].num_labels)
            metrics.update({f"{name}/{k}": v for k, v in got.items()})
        for key in ("accuracy", "macro_f1"):
            values = [metrics[f"{n}/{key}"] for n in gold]
            metrics[f"mean_{key}"] = float(np.mean(values)) if values else 0.0
        return metrics

    def write_predictions(self, path: Path, predictions: dict[str, torch.Tensor], instances, probabilities: bool
                          ) -> None:
        """TSV with one label column per dataset (header: the dataset names), and on request one
        ``prob_<name>_<label>`` column per dataset and class."""
        from pentad.files import atomic_write_text

        header = list(self.names)
        columns = []
        for name in self.names:
            labels = list(self.tasks[name].label_map.names)
            columns.append([[labels[int(i)]] for i in predictions[name].argmax(-1).numpy()])
        if probabilities:
            for name in self.names:
                labels = list(self.tasks[name].label_map.names)
                header += [f"prob_{name}_{label}" for label in labels]
                probs = torch.softmax(predictions[name], dim=-1).numpy()
                columns.append([[f"{x:.6f}" for x in row] for row in probs])
        rows: Iterator[list[str]] = (sum(parts, []) for parts in zip(*columns))
        atomic_write_text(path, "\n".join(["\t".join(header), *("\t".join(r) for r in rows)]) + "\n")
