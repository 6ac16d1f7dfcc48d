"""SimCSE: contrastive fine-tuning of sentence embeddings (Gao et al. 2021), evaluated by the
rank correlation of cosine similarity with graded or binary similarity labels.

The model runs with two streams through one tower: a one-stream model (a BERT run, say) is
given by :meth:`SimcseTask.model_config` ``streams: {text_a, text_b: {share: text_a}}`` with the
task's pooling, which keeps its parameter names, so ``init`` may be any one-stream run. The head is
``clr`` with a fixed temperature and one direction (stream 0 -> stream 1), as SimCSE.

- ``unsupervised``: each training sentence (``text_a``) is the batch *and* ``Batch.pair``; a tied
  model stacks the two copies into one forward pass of 2B rows, so each copy draws its own dropout
  mask, and the copies are each other's positive (every other sentence of the global batch is a
  negative).
- ``supervised``: ``text_a`` is the batch, ``text_b`` (its positive: an entailment, a paraphrase)
  ``Batch.pair``, and an optional ``hard_negative`` column ``Batch.negative`` (Sup-SimCSE's
  contradictions), which joins the candidates of every row.

Keeping the second copy in ``Batch.pair`` (rather than 2B rows of one batch) keeps each sentence
and its positive on the same rank when a distributed run splits a batch by rows (``Batch.rows``).

Files are TencentPretrain's ``run_simcse.py`` TSVs (header required): training ``text_a`` alone
(unsupervised) or with ``text_b`` (and here ``hard_negative``); a ``label`` column is ignored in
training. Evaluation and inference read pairs ``label<TAB>text_a<TAB>text_b`` (label: a graded or
binary similarity, any real number; optional for inference), scored by Spearman's correlation of
cosine similarity with the label.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import Batch
from pentad.config.dual_layout import from_dual_encoder
from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, in_order
from pentad.tasks.correlation import pearson, spearman

COLUMNS = ("label", "text_a", "text_b", "hard_negative")


class SimcseTaskConfig(TaskConfig):
    type: Literal["simcse"] = "simcse"
    mode: Literal["unsupervised", "supervised"] = Field(
        "unsupervised", description="unsupervised: each text_a is its own positive, through two dropout masks; "
        "supervised: text_b is text_a's positive (and hard_negative, when the file has it, a hard negative)")
    temperature: float = Field(0.05, gt=0.0, description="softmax temperature of the cosine similarities")
    pooling: PoolingKind = Field("first", description="sentence vector from the token states: first "
                                 "([CLS]), mean, max or last (TencentPretrain's --pooling, default first)")
    metric: Literal["spearman", "pearson"] = Field("spearman", description="dev metric that picks the best model")


@dataclass
class SimcseInstances:
    """Encoded rows of a SimCSE TSV: ``[CLS] text [SEP]`` per column present (text_b and
    hard_negative may be None), raw labels (strings, None without a label column) and line numbers."""

    path: Path
    columns: tuple[str, ...]
    text_a: Instances
    text_b: Instances | None = None
    hard_negative: Instances | None = None
    labels: list[str] | None = None
    lines: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.text_a)


def read_simcse_tsv(path: Path) -> tuple[tuple[str, ...], list[dict[str, str]], list[int]]:
    """(columns, rows as column -> text, line numbers) of a SimCSE TSV; UserError naming the file
    and line for a missing file, a bad header, a wrong field count or an empty text."""
    columns: tuple[str, ...] = ()
    rows: list[dict[str, str]] = []
    lines: list[int] = []
    for found, window, numbers in iter_simcse_tsv(path):
        columns, rows, lines = found, rows + window, lines + numbers
    return columns, rows, lines


def iter_simcse_tsv(path: Path, window: int | None = None
                    ) -> Iterator[tuple[tuple[str, ...], list[dict[str, str]], list[int]]]:
    """:func:`read_simcse_tsv` in consecutive windows of at most ``window`` rows (None: one window),
    read lazily (streamed inference); the same checks, a file without rows failing at its end."""
    from pentad.data.corpus import BadLine, decode_line

    path = Path(path)
    if not path.is_file():
        raise UserError(f"TSV file {path} does not exist." if not path.exists() else f"TSV path {path} is not a file.")
    columns: tuple[str, ...] = ()
    rows: list[dict[str, str]] = []
    lines: list[int] = []
    seen = False
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                text = decode_line(raw, line_no)
            except BadLine as bad:
                raise UserError(f"{path}, line {line_no}: the line {bad}.") from None
            if line_no == 1:
                columns = tuple(c.strip() for c in text.split("\t"))
                unknown = [c for c in columns if c not in COLUMNS]
                if unknown or "text_a" not in columns or len(set(columns)) != len(columns):
                    what = (f"unknown column name(s) {unknown}" if unknown else "no 'text_a' column"
                            if "text_a" not in columns else "a column name appears twice")
                    raise UserError(f"{path}, line 1: expected a header line naming the columns, e.g. "
                                    "'text_a' (unsupervised training), 'text_a<TAB>text_b[<TAB>hard_negative]' "
                                    "(supervised training) or 'label<TAB>text_a<TAB>text_b' (evaluation pairs); "
                                    f"found {text[:80]!r} ({what}).")
                continue
            values = text.split("\t")
            if len(values) != len(columns):
                raise UserError(f"{path}, line {line_no}: the line has {len(values)} tab-separated field(s), the "
                                f"header has {len(columns)} ({chr(9).join(columns)!r}).")
            row = dict(zip(columns, values))
            empty = [c for c in columns if not row[c].strip()]
            if empty:
                raise UserError(f"{path}, line {line_no}: the {' and '.join(empty)} field is empty; every "
                                "example needs its texts (and its label, when the file has a label column).")
            rows.append(row)
            lines.append(line_no)
            seen = True
            if window is not None and len(rows) >= window:
                yield columns, rows, lines
                rows, lines = [], []
    if not columns:
        raise UserError(f"TSV file {path} is empty; expected a header line and data lines.")
    if not seen:
        raise UserError(f"TSV file {path} has a header but no data lines.")
    if rows:
        yield columns, rows, lines


def encode_sentences(texts: list[str], tokenizer: Any, seq_length: int) -> Instances:
    """``[CLS] text [SEP]`` per text, truncated to ``seq_length`` tokens."""
    from pentad.data.tsv import assemble_pairs

    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        from pentad.data.masking import describe_tokenizer

        raise UserError(f"simcse needs [CLS] and [SEP] tokens, which the {describe_tokenizer(tokenizer)} lacks.")
    sequences, _ = assemble_pairs(tokenizer.encode_batch(texts), None, int(tokenizer.cls_id),
                                  int(tokenizer.sep_id), seq_length)
    return Instances.from_sequences(sequences)


def sentence_batch(instances: Instances, pad_id: int) -> Batch:
    """tokens / segments (all 0) / padding_mask [B,S] of single sentences."""
    ids, valid = instances.padded(pad_id)
    return Batch(tokens=torch.from_numpy(ids), segments=torch.zeros(ids.shape, dtype=torch.long),
                 padding_mask=torch.from_numpy(~valid))


@TASKS.register("simcse")
class SimcseTask(Task):
    """Contrastive sentence embeddings (SimCSE, unsupervised or supervised); Spearman on a pair set."""

    Config = SimcseTaskConfig
    head = "clr"
    input_format = "train: text_a[<TAB>text_b[<TAB>hard_negative]]; eval: label<TAB>text_a<TAB>text_b"
    metric_names = ("spearman", "pearson")
    provides = frozenset({"tokens", "segments", "padding_mask", "pair.tokens", "pair.segments",
                          "pair.padding_mask"})

    def __init__(self, cfg: SimcseTaskConfig, tokenizer, seq_length: int, state=None):
        self.columns: tuple[str, ...] = ()
        super().__init__(cfg, tokenizer, seq_length, state)
        self.pad_id = int(tokenizer.pad_id) if tokenizer.pad_id is not None else 0

    # ---------------------------------------------------------------- model
    def fit(self, train_path: Path) -> None:
        """Check that the training file has what ``task.mode`` needs."""
        columns, _, _ = read_simcse_tsv(train_path)
        if self.cfg.mode == "supervised" and "text_b" not in columns:
            raise UserError(f"{train_path}, line 1: task.mode is supervised, which trains on pairs: the file needs a "
                            f"text_b column (text_a's positive), but its columns are {list(columns)}. Add text_b (and "
                            "optionally hard_negative), or set task.mode=unsupervised to train on text_a alone.")
        self.columns = columns

    def describe(self) -> str:
        what = ("text_a twice, through two dropout masks" if self.cfg.mode == "unsupervised" else
                "text_a -> text_b" + (" with hard negatives" if "hard_negative" in self.columns else ""))
        return f"{self.cfg.mode} ({what}), temperature {self.cfg.temperature}, pooling {self.cfg.pooling}"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "clr", "name": self.head, "temperature": self.cfg.temperature, "symmetric": False}]

    def model_config(self, model: dict[str, Any]) -> dict[str, Any]:
        """Two streams through the configured embedding and encoder (the second shares the first's
        modules), pooling by ``task.pooling``; a two-stream model keeps its streams, both pooling by
        ``task.pooling`` (docs/streams.md)."""
        model = from_dual_encoder(dict(model))
        streams = model.get("streams") or {"text_a": {}, "text_b": {"share": "text_a"}}
        model["streams"] = {name: {**dict(stream or {}), "pooling": self.cfg.pooling}
                            for name, stream in streams.items()}
        return model

    # ---------------------------------------------------------------- data
    def read(self, path: Path, with_labels: bool = True) -> SimcseInstances:
        return self._encode(path, *read_simcse_tsv(path))

    def read_windows(self, path: Path, window: int):
        return (self._encode(path, *found) for found in iter_simcse_tsv(path, window))

    def _encode(self, path: Path, columns: tuple[str, ...], rows: list[dict[str, str]], lines: list[int]
                ) -> SimcseInstances:
        def encode(column: str) -> Instances | None:
            if column not in columns:
                return None
            return encode_sentences([r[column] for r in rows], self.tokenizer, self.seq_length)

        labels = [r["label"].strip() for r in rows] if "label" in columns else None
        return SimcseInstances(Path(path), columns, encode("text_a"), encode("text_b"),  # type: ignore[arg-type]
                               encode("hard_negative"), labels, np.asarray(lines, dtype=np.int64))

    def collate(self, instances: SimcseInstances, indices, rng: np.random.Generator) -> Batch:
        """Training batch: text_a, with ``pair`` = text_a again (unsupervised) or text_b (supervised),
        and ``negative`` = hard_negative when the file has it (supervised)."""
        idx = np.asarray(indices)
        batch = sentence_batch(instances.text_a[idx], self.pad_id)
        if self.cfg.mode == "unsupervised":
            # The same tensors: a shared tower stacks both copies into one pass, and dropout
            # differs between the copies' rows.
            batch.pair = Batch(tokens=batch.tokens, segments=batch.segments, padding_mask=batch.padding_mask)
            return batch
        if instances.text_b is None:
            raise UserError(f"{instances.path}: task.mode is supervised, but the file has no text_b column "
                            f"(its columns are {list(instances.columns)})")
        batch.pair = sentence_batch(instances.text_b[idx], self.pad_id)
        if instances.hard_negative is not None:
            batch.negative = sentence_batch(instances.hard_negative[idx], self.pad_id)
        return batch

    def _pairs(self, instances: SimcseInstances) -> Instances:
        if instances.text_b is None:
            raise UserError(f"{instances.path}, line 1: simcse scores sentence pairs: the file needs a text_b "
                            f"column ('label<TAB>text_a<TAB>text_b', the label optional for inference), but its "
                            f"columns are {list(instances.columns)}. For one vector per sentence use "
                            "`pentad embed RUN --input FILE`.")
        return instances.text_b

    def gold(self, instances: SimcseInstances) -> np.ndarray:
        """The similarity labels as floats [N]."""
        self._pairs(instances)
        if instances.labels is None:
            raise UserError(f"{instances.path}, line 1: an evaluation file needs a label column (a similarity "
                            f"score per pair), but its columns are {list(instances.columns)}.")
        gold = np.zeros(len(instances), dtype=np.float64)
        for i, (label, line) in enumerate(zip(instances.labels, instances.lines)):
            try:
                gold[i] = float(label)
            except ValueError:
                gold[i] = math.nan
            if not math.isfinite(gold[i]):
                raise UserError(f"{instances.path}, line {int(line)}: label {label!r} is not a number; the label "
                                "of an evaluation pair is its similarity (a graded score, or 0/1).")
        return gold

    # ---------------------------------------------------------------- prediction and evaluation
    @torch.no_grad()
    def predict(self, model, instances: SimcseInstances, batch_size: int, device, progress: str | None = None
                ) -> np.ndarray:
        """The cosine similarity of each text_a / text_b pair [N] (through the model's ``clr`` head:
        the diagonal of its scaled similarities, times the temperature)."""
        second = self._pairs(instances)
        was_training = model.training
        model.eval()
        out = []
        try:
            for idx in in_order(len(instances), batch_size, progress):
                batch = sentence_batch(instances.text_a[idx], self.pad_id)
                batch.pair = sentence_batch(second[idx], self.pad_id)
                logits = model(batch.to(device))[self.head].logits.float()
                out.append((torch.diagonal(logits) * self.cfg.temperature).cpu().numpy())
        finally:
            model.train(was_training)
        return np.concatenate(out) if out else np.zeros(0)

    def score(self, predictions: np.ndarray, instances: SimcseInstances, gold: np.ndarray) -> dict[str, float]:
        return {"spearman": spearman(predictions, gold), "pearson": pearson(predictions, gold)}

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``similarity``: the cosine similarity of each pair, in input order."""
        return "similarity"

    def prediction_lines(self, predictions: np.ndarray, instances: SimcseInstances, probabilities: bool
                         ) -> list[str]:
        return [f"{x:.6f}" for x in predictions]
