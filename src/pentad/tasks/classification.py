"""Sentence and sentence-pair classification: TSV ``label\ttext_a[\ttext_b]`` -> ``cls`` head.

Training, evaluation and inference read files through the same code (``pentad.data.tsv``) and
batch through the ``cls`` objective's collate.

A pair goes into the model one of two ways (``pair_input``): ``joint``, one sequence
``[CLS] a [SEP] b [SEP]`` with segments 0/1 for a one-stream model (a BERT cross-encoder); or
``separate``, ``[CLS] a [SEP]`` as the batch and ``[CLS] b [SEP]`` as ``Batch.pair`` for a two-stream
model (SBERT, siamese LSTM), with a ``pair_cls`` head over the two pooled vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.targets.pair_cls import PairFeature
from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.registry import OBJECTIVES, TASKS
from pentad.tasks.base import Task, TaskConfig, classification_metrics, in_order, predict_logits


class ClassificationTaskConfig(TaskConfig):
    type: Literal["classification"] = "classification"
    num_labels: int | None = Field(None, ge=2, description="default: the labels found in the training set")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    truncation: Literal["longest_first", "end"] = Field(
        "longest_first", description="a text longer than seq_length: longest_first, each text shortened so that "
        "[CLS] a [SEP] (b [SEP]) fits, a pair's longer text first (BERT); end, the whole sequence cut at seq_length "
        "(TencentPretrain's run_classifier.py: the final [SEP] is lost, a long text_a crowds out text_b)")
    metric: Literal["accuracy", "macro_f1"] = Field("accuracy", description="dev metric that picks the best model")
    pair_input: Literal["joint", "separate"] = Field(
        "joint", description="how text_a and text_b enter the model: joint, one sequence [CLS] a [SEP] b [SEP] "
        "(one-stream models); separate, two streams (model.streams: SBERT, siamese LSTM) with a pair_cls head")
    pair_features: list[PairFeature] = Field(["u", "v", "abs_diff"], min_length=1, description="with "
                                             "pair_input separate: the pair_cls head's features (u, v, "
                                             "abs_diff, product)")
    pair_mlp_size: int | None = Field(None, ge=1, description="with pair_input separate: a hidden layer of "
                                      "this width in the pair_cls head (InferSent: 512)")


@TASKS.register("classification")
class ClassificationTask(Task):
    """Sentence and sentence-pair classification (sentiment, NLI, paraphrase): a softmax head.

    Pairs enter one stream joined, or two streams (model.streams).
    """

    Config = ClassificationTaskConfig
    head = "cls"
    input_format = "label<TAB>text_a[<TAB>text_b]"
    metric_names = ("accuracy", "macro_f1")

    def __init__(self, cfg: ClassificationTaskConfig, tokenizer, seq_length: int, state=None):
        from pentad.data.objectives.cls import ClsObjectiveConfig

        self.label_map = None
        self.objective = OBJECTIVES.get("cls")(ClsObjectiveConfig(seq_length=seq_length), tokenizer)
        super().__init__(cfg, tokenizer, seq_length, state)

    @property
    def separate(self) -> bool:
        """Whether text_a and text_b go to the two streams of a two-stream model."""
        return self.cfg.pair_input == "separate"

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        fields = {"tokens", "segments", "padding_mask", "labels.cls"}
        if self.separate:
            fields |= {"pair.tokens", "pair.segments", "pair.padding_mask"}
        return frozenset(fields)

    # ---------------------------------------------------------------- data
    def fit(self, train_path: Path) -> None:
        """Build the label map from the training file (ids 0..n-1 if all labels are integers)."""
        from pentad.data.tsv import LabelMap, read_classification_tsv

        rows, _ = read_classification_tsv(train_path, with_labels=True)
        self.label_map = LabelMap.from_rows(rows, train_path, num_labels=self.cfg.num_labels)

    def state(self) -> dict[str, Any]:
        return self.label_map.to_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        from pentad.data.tsv import LabelMap

        self.label_map = LabelMap.from_dict(state)

    def describe(self) -> str:
        return f"{self.num_labels} labels {self.label_map.names}"

    def read(self, path: Path, with_labels: bool = True):
        """The instances of a TSV file."""
        from pentad.data.tsv import read_classification_tsv

        rows, _ = read_classification_tsv(path, with_labels=with_labels)
        return self.encode_rows(rows, path, with_labels)

    def read_windows(self, path: Path, window: int):
        from pentad.data.tsv import iter_classification_tsv

        return (self.encode_rows(rows, path, False) for rows, _ in iter_classification_tsv(path, False, window=window))

    def encode_rows(self, rows, path: Path, with_labels: bool):
        """The instances of rows read from ``path``."""
        from pentad.data.tsv import encode_classification

        label_map = self.label_map if with_labels else None
        if self.separate:
            return encode_separate_pairs(rows, self.tokenizer, self.seq_length, label_map, path)
        return encode_classification(rows, self.tokenizer, self.seq_length, label_map, path=path,
                                     truncation=self.cfg.truncation)

    def collate(self, instances, indices, rng: np.random.Generator):
        chosen = instances[np.asarray(indices)]
        if self.separate:
            return collate_separate_pairs(chosen, self.objective.pad_id)
        return self.objective.collate(chosen, rng)

    @property
    def num_labels(self) -> int:
        return self.label_map.num_labels

    def head_configs(self) -> list[dict[str, Any]]:
        if self.separate:
            # Named "cls" like the joint head, so labels, checkpoints and predictions read the same.
            return [{"type": "pair_cls", "name": self.head, "num_labels": self.num_labels,
                     "features": list(self.cfg.pair_features), "mlp_size": self.cfg.pair_mlp_size,
                     "dropout": self.cfg.head_dropout}]
        return [{"type": "cls", "num_labels": self.num_labels, "pooling": self.cfg.pooling,
                 "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- evaluation and output
    def score(self, predictions: torch.Tensor, instances, gold: np.ndarray) -> dict[str, float]:
        return classification_metrics(predictions.argmax(-1).numpy(), gold, self.num_labels)

    def predict(self, model, instances, batch_size: int, device, progress: str | None = None) -> torch.Tensor:
        """The head's logits [N, num_labels]."""
        rng = np.random.default_rng(0)
        n = len(instances)
        batches = (self.collate(instances, idx, rng) for idx in in_order(n, batch_size, progress))
        return predict_logits(model, batches, self.head, device)

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``label`` (and one ``prob_<label>`` column per class on request)."""
        return "\t".join(["label"] + ([f"prob_{n}" for n in self.label_map.names] if probabilities else []))

    def prediction_lines(self, logits: torch.Tensor, instances, probabilities: bool) -> list[str]:
        names = list(self.label_map.names)
        probs = torch.softmax(logits, dim=-1).numpy()
        preds = logits.argmax(-1).numpy()
        return ["\t".join([names[int(p)]] + ([f"{x:.6f}" for x in row] if probabilities else []))
                for p, row in zip(preds, probs)]


# ------------------------------------------------------------------------- separate pairs
def encode_separate_pairs(rows, tokenizer: Any, seq_length: int, label_map, path: Path | str = "<rows>"):
    """Rows with text_a and text_b -> Instances for two streams.

    Each instance is ``[CLS] a [SEP] [CLS] b [SEP]``, each text truncated to ``seq_length``
    tokens with its own [CLS] and [SEP]; the field ``split`` is where ``[CLS] b`` starts (so
    indexing and shuffling work as for joint pairs). ``label`` as in ``encode_classification``.
    """
    from pentad.data.shards import Instances
    from pentad.data.tsv import assemble_pairs

    if rows and rows[0].text_b is None:
        raise UserError(f"{path}: pair_input is 'separate' (two streams for a two-stream model), but the file "
                        "has no text_b column; give 'label<TAB>text_a<TAB>text_b' pairs, or use "
                        "task.pair_input=joint with a one-stream model")
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        from pentad.data.masking import describe_tokenizer

        raise UserError(f"classification needs [CLS] and [SEP] tokens, which the "
                        f"{describe_tokenizer(tokenizer)} lacks.")
    cls_id, sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)
    first, _ = assemble_pairs(tokenizer.encode_batch([r.text_a for r in rows]), None, cls_id, sep_id, seq_length)
    second, _ = assemble_pairs(tokenizer.encode_batch([r.text_b or "" for r in rows]), None, cls_id, sep_id,
                               seq_length)
    fields: dict[str, Any] = {"split": [len(a) for a in first]}
    if label_map is not None and rows and all(r.label is not None for r in rows):
        fields["label"] = [label_map.encode(r.label or "", path, r.line) for r in rows]
    return Instances.from_sequences([np.concatenate([a, b]) for a, b in zip(first, second)], **fields)


def collate_separate_pairs(instances, pad_id: int):
    """Instances from ``encode_separate_pairs`` -> Batch of text A (tokens/segments/padding_mask
    [B,Sa]) whose ``pair`` holds text B ([B,Sb]); labels.cls [B] when the instances have labels.
    Each stream is one segment (ids 0)."""
    from pentad.components.base import Batch
    from pentad.data.shards import Instances, concat_ranges

    starts, split = instances.offsets[:-1], instances.fields["split"]

    def stream(begin: np.ndarray, lengths: np.ndarray) -> Batch:
        part = Instances(instances.tokens[concat_ranges(begin, lengths)], lengths)
        ids, valid = part.padded(pad_id)
        return Batch(tokens=torch.from_numpy(ids), segments=torch.zeros(ids.shape, dtype=torch.long),
                     padding_mask=torch.from_numpy(~valid))

    batch = stream(starts, split)
    batch.pair = stream(starts + split, instances.lengths - split)
    if "label" in instances.fields:
        batch.labels["cls"] = torch.from_numpy(instances.fields["label"].astype(np.int64))
    return batch
