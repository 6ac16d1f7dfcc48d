"""The task contract (:class:`Task`) and what tasks share: batching in-memory instances, evaluation, metrics."""

from __future__ import annotations

import math
import random
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import Batch
from pentad.config.base import StrictModel
from pentad.data.loader import iterate_batches


class TaskConfig(StrictModel):
    """What every task's config has besides its own keys (``type`` and ``metric`` are declared by
    each task, ``metric`` as a ``Literal`` of the metrics it reports)."""

    probabilities: bool = Field(False, description="inference also writes the predictions' probabilities")
    defaults: Literal["auto", "pentad", "tencentpretrain"] = Field(
        "auto", description="fine-tuning defaults for the keys the config leaves unset (docs/tasks.md, "
        "\"Fine-tuning defaults\"): "
        "pentad's, or tencentpretrain, those of TencentPretrain's finetune/run_*.py scripts (no gradient "
        "clipping, no head dropout, torch's default head initialisation, its schedule, truncation and data "
        "order); auto: tencentpretrain when the config was imported from TencentPretrain or init is a "
        "TencentPretrain checkpoint (converted, or a run trained from a TencentPretrain config), else pentad")
    head_init: Literal["model", "torch"] = Field(
        "model", description="how the task's new head starts: model, the model's initialisation (N(0, "
        "model.init_std), zero biases, as BERT and Hugging Face); torch, torch's default for each layer "
        "(uniform within +-1/sqrt(fan_in)), as TencentPretrain's heads")
    if TYPE_CHECKING:  # declared by each task, as Literals
        type: str
        metric: str


class Task(ABC):
    """The contract between a downstream task and the runner (``pentad finetune`` / ``pentad infer``).

    The runner calls exactly these members and nothing else of a task: it contains no task-specific
    code. A task is one file: a config class (``Config``, a :class:`TaskConfig` with a ``type``
    literal and a ``metric``), this class registered in ``TASKS``, and its docs line.

    Life of a fine-tune: ``Task(cfg, tokenizer, seq_length)`` -> :meth:`bind` to the run's config ->
    :meth:`fit` on the training file (label maps, vocabularies) -> :meth:`state` is saved in the run ->
    :meth:`head_configs` replace the pre-training targets and :meth:`model_config` may adjust the model ->
    :meth:`read` each file -> batches from :meth:`collate` train the model -> :meth:`evaluate` (=
    :meth:`predict` then :meth:`score`) picks the best model by :meth:`selection_score`. Inference rebuilds
    the task with the saved state (``Task(cfg, tokenizer, seq_length, state)``), :meth:`bind` to the run's
    config, then :meth:`read` (``with_labels=False``) -> :meth:`predict` -> :meth:`write_predictions`; a task
    that streams its input gives :meth:`read_windows`, each window then predicted and written as
    :meth:`prediction_lines` after one :meth:`prediction_header`.

    Class attributes: ``provides`` (the Batch fields its batches fill, checked against the model, as for
    objectives; may be a property), ``input_format`` (the file format, one line) and ``metric_names``
    (what :meth:`score` reports), both shown by ``pentad list tasks`` and in docs/tasks.md.
    """

    registry_name: ClassVar[str]
    Config: ClassVar[type[TaskConfig]]
    provides: ClassVar[frozenset[str]] = frozenset()
    input_format: ClassVar[str] = ""
    predictions_file: ClassVar[str] = "predictions.tsv"  # inference's default output name, in the run directory
    metric_names: ClassVar[tuple[str, ...]] = ()
    needs_tokenizer: ClassVar[bool] = True  # False: the task reads no text (image classification)
    # task options ``pentad infer`` may change (task.KEY=VALUE): those that only shape decoding or
    # output, never the model or what fine-tuning learnt
    inference_options: ClassVar[frozenset[str]] = frozenset()
    # True: each split is several files, one per dataset ({name: file}, as ``sources`` gives them;
    # multi-task), so ``pentad evaluate`` takes data.test.NAME=FILE; False: one file (data.test=FILE)
    named_inputs: ClassVar[bool] = False

    def __init__(self, cfg: Any, tokenizer: Any, seq_length: int, state: dict[str, Any] | None = None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        if state is not None:
            self.load_state(state)

    # ---------------------------------------------------------------- inputs
    @classmethod
    def sources(cls, cfg: Any, data: Any) -> dict[str, Any]:
        """The fine-tuning inputs as :meth:`fit` and :meth:`read` take them: ``{"train": ..., "dev": ...,
        "test": ...}`` (None: no such split), from the task config ``cfg`` and the run's ``data`` config;
        checked before the run starts. Default: the files ``data.train`` (required), ``data.dev`` and
        ``data.test``; a task reading several files per split (multi-task) lists its own."""
        if data.train is None:
            from pentad.errors import UserError

            raise UserError("data.train is not set: give the training TSV file")
        return {"train": data.train, "dev": data.dev, "test": data.test}

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        """The training input's examples, in file order, as the units cross-validation (``train.folds``)
        deals into folds: what one fold holds out stays together (a ranking question's candidates, a
        QA paragraph's questions). Opaque to the runner, handed back to :meth:`write_examples`.
        Default: the data lines of a TSV file with a header line."""
        header, lines = read_tsv_lines(Path(source))
        return lines

    @classmethod
    def write_examples(cls, source: Any, examples: Sequence[Any], out: Path) -> Path:
        """Write ``examples`` (some of :meth:`examples` of ``source``, in order) as an input in the same
        format as ``source``, at ``out`` plus the source's suffix; returns what ``data.train`` /
        ``data.dev`` then name. Companion files (ChID's answers) are written beside it. Default: the
        TSV header line, then the lines."""
        from pentad.files import atomic_write_text

        header, _ = read_tsv_lines(Path(source))
        path = out.with_suffix(Path(source).suffix or ".tsv")
        atomic_write_text(path, "".join(line + "\n" for line in [header, *examples]))
        return path

    @property
    def trains(self) -> bool:
        """Whether fine-tuning trains. False (a zero-shot task): ``pentad finetune`` only scores the
        initial model on dev/test and keeps it as the run's model; the training input is not read
        (:meth:`fit` gets ``sources["train"]``, which may then be None). Default: True."""
        return True

    # ---------------------------------------------------------------- fitting and state
    def bind(self, run_cfg: Any) -> None:
        """Take what the task needs from the run's config (the model: encoder-decoder or decoder-only,
        its heads; the data objective), before :meth:`head_configs`, :attr:`provides` or :meth:`read`
        are used; called at fine-tuning and again at inference (default: nothing)."""
        return None

    def fit(self, train_path: Any) -> None:
        """Learn from the training file what the head needs (a label map, ...); default: nothing."""
        return None

    def state(self) -> dict[str, Any]:
        """What :meth:`fit` learnt, as JSON: saved in the run, handed back at inference (default: nothing)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned (default: nothing to restore)."""
        return None

    def describe(self) -> str:
        """One line for the log after :meth:`fit` (e.g. the labels found)."""
        return ""

    @abstractmethod
    def head_configs(self) -> list[dict[str, Any]]:
        """The target configs of the task's head(s), replacing the pre-training targets."""

    def model_config(self, model: dict[str, Any]) -> dict[str, Any]:
        """The model config (a dict, the run config's ``model``) the task fine-tunes: the configured
        one, its ``targets`` already replaced by :meth:`head_configs`. Default: unchanged; a task may
        reshape it (SimCSE runs a one-stream encoder as a tied two-stream model)."""
        return model

    def head_names(self) -> tuple[str, ...]:
        """The names of the heads :meth:`head_configs` adds (fresh weights when the model is initialised)."""
        return tuple(c.get("name") or c["type"] for c in self.head_configs())

    # ---------------------------------------------------------------- data
    @abstractmethod
    def read(self, path: Any, with_labels: bool = True) -> Any:
        """The encoded instances of a file (any object with ``len()``); ``with_labels=False``: an
        inference input, whose answers are absent or ignored."""

    @abstractmethod
    def collate(self, instances: Any, indices: Sequence[int], rng: np.random.Generator) -> Batch:
        """The Batch of ``instances[indices]`` (with the head's labels when the instances have them)."""

    def train_batches(self, instances: Any, batch_size: int, seed: int) -> EpochBatches:
        """The training batches (``batches_per_epoch`` and ``iterate(start)``, resumable at any micro-batch).
        Default: :class:`EpochBatches` of ``batch_size`` instances, reshuffled each epoch; a task may
        group them (multi-task: each batch from one dataset)."""
        return EpochBatches(len(instances), batch_size, seed, lambda idx, rng: self.collate(instances, idx, rng))

    def gold(self, instances: Any) -> Any:
        """The reference answers of read instances, in the form :meth:`score` takes (default: the
        ``label`` field, one class id per instance)."""
        return np.asarray(instances.fields["label"], dtype=np.int64)

    # ---------------------------------------------------------------- prediction and evaluation
    @abstractmethod
    def predict(self, model: torch.nn.Module, instances: Any, batch_size: int, device: torch.device,
                progress: str | None = None) -> Any:
        """The model's predictions on ``instances`` (logits, or structured answers), in eval mode."""

    @abstractmethod
    def score(self, predictions: Any, instances: Any, gold: Any) -> dict[str, float]:
        """Metrics of ``predictions`` against ``gold`` (names from ``metric_names``)."""

    def evaluate(self, model: torch.nn.Module, instances: Any, gold: Any, batch_size: int, device: torch.device,
                 progress: str | None = None) -> dict[str, float]:
        return self.score(self.predict(model, instances, batch_size, device, progress), instances, gold)

    @property
    def selection_metric(self) -> str:
        """The name of the dev metric that picks the best model (``task.metric``; drawn in loss.png)."""
        return str(self.cfg.metric)

    def selection_score(self, metrics: dict[str, float]) -> float:
        """The number that picks the best model on dev, higher is better (default: ``task.metric``)."""
        return float(metrics.get(self.selection_metric, 0.0))

    def num_predictions(self, instances: Any) -> int:
        """How many answers :meth:`predict` gives for ``instances`` (reported by inference): one per
        instance by default; a task whose instances are parts of an example (QA's windows of a
        question) counts the examples."""
        return len(instances)

    def write_predictions(self, path: Path, predictions: Any, instances: Any, probabilities: bool) -> None:
        """Write :meth:`predict`'s output for ``instances`` to ``path`` (atomically). Default: the
        :meth:`prediction_header` line, then the :meth:`prediction_lines`; a task whose output is one
        document (JSON) overrides it."""
        from pentad.files import atomic_open

        with atomic_open(path) as f:
            write_lines(f, [self.prediction_header(probabilities)])
            write_lines(f, self.prediction_lines(predictions, instances, probabilities))

    # ---------------------------------------------------------------- streamed inference
    def read_windows(self, path: Any, window: int) -> Iterator[Any] | None:
        """The inference input (as ``read(path, with_labels=False)`` reads it) in consecutive windows of
        at most ``window`` examples, each what :meth:`read` returns for those lines (with the file's line
        numbers), read lazily: ``pentad infer`` predicts and writes one window at a time, so its memory
        does not grow with the input. None (the default): the task reads its input whole, because its
        output needs every example at once (a ranking's ranks within a question, QA's windows mapped
        back to questions, a JSON document); it then writes with :meth:`write_predictions`. A task that
        streams writes its output as :meth:`prediction_header` and :meth:`prediction_lines`."""
        return None

    def prediction_header(self, probabilities: bool) -> str:
        """The header line of the predictions file (tasks writing one line per prediction)."""
        raise NotImplementedError(f"{type(self).__name__} writes its predictions with write_predictions")

    def prediction_lines(self, predictions: Any, instances: Any, probabilities: bool) -> Iterable[str]:
        """The lines (without line ends) of :meth:`predict`'s output for ``instances``, in order, after
        :meth:`prediction_header`."""
        raise NotImplementedError(f"{type(self).__name__} writes its predictions with write_predictions")


def window_size(batch_size: int, window: int) -> int:
    """Examples per window of streamed inference and embedding: ``window`` rounded up to whole batches,
    so that the batches are those of reading the input whole (the same output, byte for byte)."""
    return batch_size * max(1, math.ceil(window / batch_size))


def write_lines(f: Any, lines: Iterable[str]) -> None:
    """Each of ``lines`` and a line end, to the text file ``f``."""
    for line in lines:
        f.write(line + "\n")


def read_tsv_lines(path: Path) -> tuple[str, list[str]]:
    """A TSV file's header line and its non-empty data lines (as text, without line ends)."""
    from pentad.errors import UserError

    if not path.is_file():
        raise UserError(f"{path} does not exist (the training file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e})") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    if len(lines) < 2:
        raise UserError(f"{path}: expected a header line and data lines, found {len(lines)} non-empty line(s)")
    return lines[0], lines[1:]


class EpochBatches:
    """Batches over ``n`` in-memory instances, reshuffled each epoch.

    ``order`` (``train.data_order``): ``seeded``, each epoch a permutation drawn from ``(seed, epoch)``;
    ``tencentpretrain``, the index list shuffled in place by Python's ``random.Random(seed)`` once per
    epoch (epoch e's order is the e-th shuffle of the one before), which is the order TencentPretrain's
    fine-tuning scripts train in (``set_seed``, then ``random.shuffle`` of the example list each epoch).
    ``iterate(start)`` yields batches from micro-batch ``start`` on, exactly as an uninterrupted
    run would; the last, smaller batch of an epoch is kept (no example is dropped). Batch ``i``
    (``batch(i)``) is a pure function of ``i``, so ``num_workers`` DataLoader worker processes
    (``data.loader_workers``) build the same batches, in the same order, as the main process does.
    """

    ORDERS = ("seeded", "tencentpretrain")

    def __init__(self, n: int, batch_size: int, seed: int,
                 collate: Callable[[Sequence[int], np.random.Generator], Batch], num_workers: int = 0,
                 order: str = "seeded"):
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.collate = collate
        self.num_workers = num_workers
        self.order = order
        self.batches_per_epoch = math.ceil(n / batch_size)
        self._epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the instances in ``epoch`` (0-based)."""
        if self.order == "tencentpretrain":
            shuffler, rows = random.Random(self.seed), list(range(self.n))
            for _ in range(epoch + 1):
                shuffler.shuffle(rows)
            return np.asarray(rows, dtype=np.int64)
        if self.order != "seeded":
            raise ValueError(f"order {self.order!r}: expected one of {self.ORDERS}")
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def batch(self, i: int) -> Batch:
        """Micro-batch ``i`` (0-based, counted from the start of training)."""
        epoch, pos = divmod(i, self.batches_per_epoch)
        if epoch != self._epoch:  # consecutive batches share an epoch's permutation
            self._order = self.permutation(epoch)
            self._epoch = epoch
        rows = self._order[pos * self.batch_size:(pos + 1) * self.batch_size]
        return self.collate(rows, np.random.default_rng([self.seed, epoch, pos]))

    def __getitem__(self, i: int) -> Batch:
        return self.batch(int(i))

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        return iterate_batches(self, start, self.num_workers, self.seed)


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


def input_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype float inputs (pixels, audio features) must have for ``model``: its weights' when they
    are not fp32 (a bf16-true run), else None (left as they are)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return None if dtype == torch.float32 else dtype


@torch.no_grad()
def predict_logits(model: torch.nn.Module, batches: Iterator[Batch], head: str, device: torch.device
                   ) -> torch.Tensor:
    """Concatenated logits of ``head`` over ``batches``, in order (eval mode, no labels needed)."""
    was_training = model.training
    model.eval()
    out = []
    dtype = input_dtype(model)
    try:
        for batch in batches:
            batch = batch.to(device, dtype=dtype)
            batch.labels = {}
            out.append(model(batch)[head].logits.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)
