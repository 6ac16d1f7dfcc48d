"""Token classification (NER, POS tagging, chunking): TSV ``text_a\\tlabel`` -> ``tagger`` head.

File format (TencentPretrain's ``run_ner`` format, header required)::

    text_a<TAB>label                         labelled (train, dev, labelled test)
    w1 w2 w3<TAB>B-PER I-PER O               words and their tags, separated by single spaces

    text_a                                   unlabelled (inference input)

Each word is tokenized on its own; its first piece carries the word's tag and the other pieces
are not scored (``IGNORE_INDEX``), as Hugging Face's token-classification examples do, so a
model converted from a ``*ForTokenClassification`` checkpoint predicts the same way. The sequence
is ``[CLS] pieces [SEP]`` when the tokenizer has those tokens (and ``task.boundary_tokens``). Words
whose first piece falls beyond ``seq_length`` are not seen by the model: they count as predicted ``O`` in evaluation
(so the score is honest) and are written as ``O`` in predictions; both say how many there were.

Evaluation reports entity-level precision / recall / F1 (the CoNLL ``conlleval`` rules, for BIO,
IOB1, BIOES and BILOU tags) and word-level accuracy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import IGNORE_INDEX, Batch
from pentad.errors import UserError
from pentad.log import get_logger
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, in_order

log = get_logger(__name__)

OUTSIDE = "O"
_CHUNK_TAG = re.compile(r"([BIESLU])-(.+)")


class NerTaskConfig(TaskConfig):
    type: Literal["ner"] = "ner"
    labels: list[str] | None = Field(None, min_length=2, description="the tag set in id order; default: 'O' "
                                     "first, then the training tags sorted")
    labels_file: Path | None = Field(None, description="the tag set as a JSON file {tag: id} (TencentPretrain's "
                                     "label2id.json); instead of labels")
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    crf: bool = Field(False, description="a CRF over the word tags (TencentPretrain's --crf_target): Viterbi "
                      "predictions; probabilities are the CRF's per-word marginals")
    crf_reduction: Literal["position", "sequence"] = Field(
        "position", description="with crf: the loss per scored word (position) or per sentence (sequence, "
        "TencentPretrain's run_ner.py)")
    boundary_tokens: bool = Field(True, description="[CLS] before and [SEP] after the words when the tokenizer "
                                  "has them; false: the words alone (TencentPretrain's run_ner.py)")
    pad_tag: bool = Field(False, description="one more class after the tags, for padding (TencentPretrain's "
                          "run_ner.py appends a [PAD] tag): in the head's softmax and the CRF, never a gold tag; "
                          "a word predicted as it is read and written as 'O'")
    metric: Literal["f1", "accuracy"] = Field("f1", description="dev metric that picks the best model: entity-"
                                              "level f1 (BIO/BIOES tags) or word-level accuracy (e.g. POS tags)")


@dataclass(frozen=True)
class TaggedRow:
    """One data line: its words and (when labelled) their tags; ``line`` is 1-based (header = 1)."""

    line: int
    words: list[str]
    tags: list[str] | None


@dataclass
class TaggedSequences:
    """Encoded rows. tokens[i]: piece ids of row i ([CLS] ... [SEP]); targets[i]: a tag id at each
    word's first piece, IGNORE_INDEX elsewhere (all IGNORE_INDEX without labels); starts[i]: the
    position of each word's first piece, for the words that fit; words[i]: the row's word count;
    gold[i]: the row's tags (None without labels)."""

    tokens: list[np.ndarray]
    targets: list[np.ndarray]
    starts: list[np.ndarray]
    words: np.ndarray
    gold: list[list[str]] | None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def truncated_words(self) -> int:
        """Words beyond ``seq_length`` over all rows (never seen by the model)."""
        return int(self.words.sum() - sum(len(s) for s in self.starts))


@dataclass
class TagPredictions:
    """Per row, the predicted tag ids of the words that fit and the probability of each (softmax,
    or the CRF's marginal); the other words of the row are not predicted."""

    tags: list[list[int]]
    probs: list[list[float]]


# ------------------------------------------------------------------------------------ reading
def read_tagging_tsv(path: Path, with_labels: bool) -> list[TaggedRow]:
    """All rows of a tagging TSV, checked: the header, one tag per word, no empty word."""
    from pentad.data.tsv import read_classification_tsv

    rows, columns = read_classification_tsv(path, with_labels=with_labels)
    return tagged_rows(rows, columns, path)


def tagged_rows(rows: Sequence[Any], columns: Sequence[str], path: Path) -> list[TaggedRow]:
    """Classification TSV rows of a tagging file (columns ``columns``) -> TaggedRows, checked as
    :func:`read_tagging_tsv` says."""
    if "text_b" in columns:
        raise UserError(f"{path}, line 1: a tagging file has the columns 'text_a<TAB>label' (words and tags "
                        "separated by spaces); found a 'text_b' column.")
    out = []
    for row in rows:
        words = row.text_a.split(" ")
        if "" in words:
            k = words.index("")
            raise UserError(f"{path}, line {row.line}: word {k + 1} is empty (two spaces in a row, or a space at "
                            "either end); words are separated by single spaces.")
        tags = None
        if row.label is not None and "label" in columns:
            tags = row.label.split(" ")
            if len(tags) != len(words):
                raise UserError(f"{path}, line {row.line}: {len(words)} word(s) but {len(tags)} tag(s); give one "
                                "tag per word, separated by single spaces.")
        out.append(TaggedRow(row.line, words, tags))
    return out


def tag_order(tags: Sequence[str]) -> list[str]:
    """The default id order of a tag set: 'O' first (when present), then the rest sorted."""
    distinct = sorted(set(tags))
    return ([OUTSIDE] if OUTSIDE in distinct else []) + [t for t in distinct if t != OUTSIDE]


def read_labels_file(path: Path) -> list[str]:
    """Tags in id order from a JSON ``{tag: id}`` file with ids 0..n-1."""
    if not Path(path).is_file():
        raise UserError(f"task.labels_file {path} does not exist.")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"task.labels_file {path} is not valid JSON ({e}).") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise UserError(f"task.labels_file {path}: expected a JSON object {{tag: id}} with integer ids, found "
                        f"{str(data)[:80]!r}.")
    if sorted(data.values()) != list(range(len(data))):
        raise UserError(f"task.labels_file {path}: the ids must be 0..{len(data) - 1}, each once; found "
                        f"{sorted(data.values())}.")
    return sorted(data, key=data.__getitem__)


# ------------------------------------------------------------------------------------ encoding
def _word_prefix(tokenizer: Any) -> str:
    """What goes before each word when it is tokenized alone: byte-level BPE marks a word start with
    a space (as HF does for words given one by one), unless the tokenizer adds it itself."""
    config = tokenizer.config()
    if getattr(config, "type", None) == "bpe" and not getattr(config, "add_prefix_space", False):
        return " "
    return ""


def encode_tagged(rows: Sequence[TaggedRow], tokenizer: Any, seq_length: int, label_map: Any,
                  path: Path | str = "<rows>", boundary_tokens: bool = True) -> TaggedSequences:
    """Rows -> TaggedSequences (see the module docstring for the layout; ``boundary_tokens`` false: no
    [CLS] / [SEP]). A word that tokenizes to nothing (a control character) becomes the unknown token, so
    every word is kept."""
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    head = [int(cls_id)] if boundary_tokens and cls_id is not None and sep_id is not None else []
    tail = [int(sep_id)] if head else []
    budget = seq_length - len(head) - len(tail)
    if budget < 1:
        raise UserError(f"seq_length {seq_length} leaves no room for words after [CLS] and [SEP].")
    prefix = _word_prefix(tokenizer)
    vocabulary = sorted({w for row in rows for w in row.words})
    pieces = dict(zip(vocabulary, tokenizer.encode_batch([prefix + w for w in vocabulary])))
    empty = [w for w, p in pieces.items() if not p]
    if empty:
        if tokenizer.unk_id is None:
            raise UserError(f"{path}: the word(s) {empty[:5]} tokenize to nothing and the tokenizer has no unknown "
                            "token to stand for them.")
        for w in empty:
            pieces[w] = [int(tokenizer.unk_id)]
    labelled = label_map is not None and bool(rows) and all(r.tags is not None for r in rows)
    tokens, targets, starts = [], [], []
    for row in rows:
        ids: list[int] = []
        first: list[int] = []
        for word in row.words:
            if len(ids) >= budget:
                break
            first.append(len(head) + len(ids))
            ids.extend(pieces[word])
        ids = head + ids[:budget] + tail
        target = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        if labelled:
            tag_ids = [label_map.encode(t, path, row.line) for t in row.tags or []]
            target[first] = tag_ids[:len(first)]
        tokens.append(np.asarray(ids, dtype=np.int64))
        targets.append(target)
        starts.append(np.asarray(first, dtype=np.int64))
    gold = [list(r.tags or []) for r in rows] if labelled else None
    return TaggedSequences(tokens, targets, starts, np.array([len(r.words) for r in rows], dtype=np.int64), gold)


def collate_tagged(seqs: TaggedSequences, indices: Sequence[int], pad_id: int, head: str) -> Batch:
    """Rows ``indices`` -> Batch: tokens/segments/padding_mask [B,S] and labels[head] [B,S]."""
    chosen = [int(i) for i in indices]
    width = max(len(seqs.tokens[i]) for i in chosen)
    tokens = np.full((len(chosen), width), pad_id, dtype=np.int64)
    labels = np.full((len(chosen), width), IGNORE_INDEX, dtype=np.int64)
    padding = np.ones((len(chosen), width), dtype=bool)
    for r, i in enumerate(chosen):
        n = len(seqs.tokens[i])
        tokens[r, :n], labels[r, :n], padding[r, :n] = seqs.tokens[i], seqs.targets[i], False
    batch = Batch(tokens=torch.from_numpy(tokens), segments=torch.zeros(tokens.shape, dtype=torch.long),
                  padding_mask=torch.from_numpy(padding))
    if seqs.gold is not None:
        batch.labels[head] = torch.from_numpy(labels)
    return batch


# ------------------------------------------------------------------------------------ metrics
def _split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type): 'B-PER' -> ('B', 'PER'), 'O' -> ('O', ''); BILOU's L/U read as E/S; a tag
    without a prefix is a one-type chunk tag ('PER' -> ('I', 'PER')), as conlleval reads it."""
    if tag == OUTSIDE:
        return "O", ""
    m = _CHUNK_TAG.fullmatch(tag)
    if m is None:
        return "I", tag
    return {"L": "E", "U": "S"}.get(m.group(1), m.group(1)), m.group(2)


def chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """Entity spans (begin, end exclusive, type) of a tag sequence, by conlleval's rules."""
    spans: set[tuple[int, int, str]] = set()
    begin: int | None = None
    prev, prev_type = "O", ""
    for i, tag in enumerate([*tags, OUTSIDE]):
        cur, cur_type = _split_tag(tag)
        ends = prev != "O" and (prev in "ES" or cur in "BSO" or prev_type != cur_type)
        starts = cur != "O" and (cur in "BS" or prev in "ESO" or prev_type != cur_type)
        if ends and begin is not None:
            spans.add((begin, i, prev_type))
            begin = None
        if starts:
            begin = i
        prev, prev_type = cur, cur_type
    return spans


def is_chunk_tag_set(names: Sequence[str]) -> bool:
    """Whether every tag is 'O' or a prefixed chunk tag (B-/I-/E-/S-/L-/U-TYPE)."""
    return all(n == OUTSIDE or _CHUNK_TAG.fullmatch(n) for n in names)


def tagging_metrics(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
                    entity_level: bool = True) -> dict[str, float]:
    """Word accuracy and (with ``entity_level``) entity precision / recall / F1 (micro, exact span and type)."""
    words = sum(len(g) for g in gold)
    right = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
    out = {"accuracy": right / words if words else 0.0}
    if entity_level:
        found = correct = wanted = 0
        for g, p in zip(gold, predicted):
            gs, ps = chunks(g), chunks(p)
            found, wanted, correct = found + len(ps), wanted + len(gs), correct + len(gs & ps)
        precision = correct / found if found else 0.0
        recall = correct / wanted if wanted else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out = {"f1": f1, "precision": precision, "recall": recall, **out}
    return out


# ------------------------------------------------------------------------------------ the task
@TASKS.register("ner")
class NerTask(Task):
    """Token classification (NER, POS tagging, chunking): a tag per word, optionally through a CRF."""

    Config = NerTaskConfig
    head = "tagger"
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.tagger"})
    input_format = "text_a<TAB>label, words and tags separated by single spaces"
    metric_names = ("f1", "precision", "recall", "accuracy")

    def __init__(self, cfg: NerTaskConfig, tokenizer, seq_length: int, state=None):
        from pentad.data.tsv import LabelMap

        if cfg.labels is not None and cfg.labels_file is not None:
            raise UserError("task.labels and task.labels_file both give the tag set; set one.")
        super().__init__(cfg, tokenizer, seq_length)
        label_map = LabelMap.from_dict(state) if state is not None else None
        if label_map is None and (cfg.labels is not None or cfg.labels_file is not None):
            names = list(cfg.labels) if cfg.labels is not None else read_labels_file(cfg.labels_file)
            if len(set(names)) != len(names):
                raise UserError(f"task.labels: a tag appears twice in {names}.")
            label_map = LabelMap(names, integer=False)
        self.label_map = label_map
        self.fixed_labels = label_map is not None
        self.pad_id = int(tokenizer.pad_id if tokenizer.pad_id is not None else 0)

    # ---------------------------------------------------------------- data
    def fit(self, train_path: Path) -> None:
        """The tag map: the configured one (checked against the training tags), else from the training file."""
        from pentad.data.tsv import LabelMap

        rows = read_tagging_tsv(train_path, with_labels=True)
        seen = {t for r in rows for t in r.tags or []}
        if self.label_map is None:
            self.label_map = LabelMap(tag_order(seen), integer=False)
        else:
            unknown = sorted(seen - set(self.label_map.names))
            if unknown:
                raise UserError(f"{train_path}: tag(s) {unknown[:10]} are not in the configured tag set "
                                f"{self.label_map.names}.")
        if self.label_map.num_labels < 2:
            raise UserError(f"{train_path}: only the tag {self.label_map.names} occurs; tagging needs 2 or more.")
        if self.cfg.metric == "f1" and not self.entity_level:
            raise UserError(f"task.metric is 'f1' (entity level), but the tags {self.label_map.names[:10]} are not "
                            "all 'O' or B-/I-/E-/S-TYPE chunk tags; use task.metric=accuracy for tags such as "
                            "parts of speech.")

    def state(self) -> dict[str, Any]:
        return self.label_map.to_dict()

    def describe(self) -> str:
        return f"{self.num_labels} tags {self.label_map.names}"

    @property
    def entity_level(self) -> bool:
        return is_chunk_tag_set(self.label_map.names)

    def read(self, path: Path, with_labels: bool = True) -> TaggedSequences:
        return self._encode(read_tagging_tsv(path, with_labels=with_labels), path, with_labels)

    def read_windows(self, path: Path, window: int):
        from pentad.data.tsv import iter_classification_tsv

        return (self._encode(tagged_rows(rows, columns, path), path, False)
                for rows, columns in iter_classification_tsv(path, False, window=window))

    def _encode(self, rows: list[TaggedRow], path: Path, with_labels: bool) -> TaggedSequences:
        seqs = encode_tagged(rows, self.tokenizer, self.seq_length, self.label_map if with_labels else None, path,
                             boundary_tokens=self.cfg.boundary_tokens)
        if seqs.truncated_words:
            log.info(f"{path}: {seqs.truncated_words:,} word(s) lie beyond seq_length {self.seq_length} and are "
                     "not seen by the model (evaluated and written as 'O')")
        return seqs

    def collate(self, instances: TaggedSequences, indices, rng: np.random.Generator) -> Batch:
        return collate_tagged(instances, indices, self.pad_id, self.head)

    def gold(self, instances: TaggedSequences) -> list[list[str]]:
        if instances.gold is None:
            raise UserError("the evaluation file has no tags (a 'label' column).")
        return instances.gold

    @property
    def num_labels(self) -> int:
        return self.label_map.num_labels

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "tagger", "num_labels": self.num_labels + int(self.cfg.pad_tag),
                 "dropout": self.cfg.head_dropout, "crf": self.cfg.crf, "crf_reduction": self.cfg.crf_reduction}]

    # ---------------------------------------------------------------- evaluation and output
    @torch.no_grad()
    def predict(self, model, instances: TaggedSequences, batch_size: int, device,
                progress: str | None = None) -> TagPredictions:
        """Predicted tags (argmax, or Viterbi with a CRF head) of each row's words that fit."""
        from pentad.layers.crf import compact

        crf = getattr(model.targets[self.head], "crf", None)
        was_training = model.training
        model.eval()
        out = TagPredictions([], [])
        try:
            for idx in in_order(len(instances), batch_size, progress):
                batch = self.collate(instances, idx, np.random.default_rng(0)).to(device)
                batch.labels = {}
                logits = model(batch)[self.head].logits.float()
                keep = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device)
                for r, i in enumerate(idx):
                    keep[r, torch.from_numpy(instances.starts[int(i)]).to(logits.device)] = True
                words, mask = compact(logits, keep)  # [B, W, L]: each row's word starts, in order
                counts = mask.sum(1).tolist()
                if crf is None:
                    probs, tags = torch.softmax(words, dim=-1).max(dim=-1)
                    out.tags += [tags[r, :n].tolist() for r, n in enumerate(counts)]
                    out.probs += [probs[r, :n].tolist() for r, n in enumerate(counts)]
                else:
                    for r, path in enumerate(crf.decode(words, mask)):
                        marginal = crf.marginals(words[r, :counts[r]])
                        out.tags.append(path)
                        out.probs.append([float(marginal[t, tag]) for t, tag in enumerate(path)])
        finally:
            model.train(was_training)
        return out

    def decode(self, instances: TaggedSequences, predictions: TagPredictions) -> list[list[str]]:
        """Predicted tags per row; words the model did not see, and words predicted as the padding class
        (``pad_tag``), are 'O' (or the first tag without 'O')."""
        names = self.label_map.names
        filler = OUTSIDE if OUTSIDE in names else names[0]
        return [[names[j] if j < len(names) else filler for j in row] + [filler] * (int(n) - len(row))
                for row, n in zip(predictions.tags, instances.words)]

    def score(self, predictions: TagPredictions, instances: TaggedSequences, gold) -> dict[str, float]:
        return tagging_metrics(gold, self.decode(instances, predictions), entity_level=self.entity_level)

    def prediction_header(self, probabilities: bool) -> str:
        """TSV with header ``label`` (space-separated tags per row) and, on request, ``prob`` (each tag's
        probability; words beyond seq_length get an empty probability field '-')."""
        return "label\tprob" if probabilities else "label"

    def prediction_lines(self, logits: TagPredictions, instances: TaggedSequences, probabilities: bool) -> list[str]:
        lines = []
        for row, scores in zip(self.decode(instances, logits), logits.probs):
            text = " ".join(row)
            if probabilities:
                probs = [f"{p:.4f}" for p in scores]
                text += "\t" + " ".join(probs + ["-"] * (len(row) - len(probs)))
            lines.append(text)
        return lines
