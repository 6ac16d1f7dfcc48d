"""Answer ranking (answer selection, DBQA): TSV ``label<TAB>qid<TAB>text_a<TAB>text_b`` -> a ``cls`` pair
classifier (2 classes) whose scores rank each question's candidate sentences.

The format is TencentPretrain's ``run_dbqa``: the columns are named by the header, in any order;
``qid`` identifies the question (any string), ``text_a`` is the question, ``text_b`` a candidate
answer sentence, ``label`` 1 when the sentence answers the question and 0 otherwise. A question's
lines are consecutive (a qid seen again after another question's lines is an error). An inference
file has no ``label`` column.

A candidate's score is the classifier's probability of label 1; a question's candidates are ranked
by it (ties in file order). Metrics, over the questions with at least one correct candidate:
``mrr`` (mean reciprocal rank of the best-ranked correct candidate) and ``map`` (mean average
precision: the mean over a question's correct candidates of the precision at each one's rank).
Questions without a correct candidate cannot be ranked and are skipped; reading a labelled file logs
how many there are. (TencentPretrain's ``run_dbqa`` instead counts such a question with a reciprocal
rank of 1 / (candidates + 1).)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.log import get_logger
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, read_tsv_lines
from pentad.tasks.texts import TextExamples, collate_texts, line_numbers, predict_texts, text_objective

log = get_logger(__name__)

COLUMNS = ("label", "qid", "text_a", "text_b")


class RankingTaskConfig(TaskConfig):
    type: Literal["ranking"] = "ranking"
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["mrr", "map"] = Field("mrr", description="dev metric that picks the best model")


# ------------------------------------------------------------------------------------ metrics
def question_groups(qids: Sequence[str]) -> list[np.ndarray]:
    """The row indices of each question, questions in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(qids):
        groups.setdefault(q, []).append(i)
    return [np.asarray(rows, dtype=np.int64) for rows in groups.values()]


def ranking_metrics(scores: np.ndarray, labels: np.ndarray, qids: Sequence[str]) -> dict[str, float]:
    """MRR and MAP of candidate ``scores`` [N] (higher ranks first, ties in row order) against 0/1
    ``labels`` [N], candidates grouped by ``qids``; questions without a correct candidate are skipped
    (0 for both when none has one)."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0
    reciprocal, precision = [], []
    for rows in question_groups(qids):
        ranked = labels[rows[np.argsort(-scores[rows], kind="stable")]]
        hits = np.flatnonzero(ranked) + 1  # the ranks of the correct candidates
        if len(hits) == 0:
            continue
        reciprocal.append(1.0 / hits[0])
        precision.append(float(np.mean(np.arange(1, len(hits) + 1) / hits)))
    return {"mrr": float(np.mean(reciprocal)) if reciprocal else 0.0,
            "map": float(np.mean(precision)) if precision else 0.0}


def unanswered(labels: np.ndarray, qids: Sequence[str]) -> int:
    """How many questions have no correct candidate (skipped by :func:`ranking_metrics`)."""
    labels = np.asarray(labels) > 0
    return sum(not labels[rows].any() for rows in question_groups(qids))


def check_consecutive(rows: Sequence[Any], path: Path | str) -> None:
    """UserError when a question's lines are not together (a qid seen again after another question)."""
    first_line: dict[str, int] = {}
    previous = None
    for row in rows:
        if row.qid != previous and row.qid in first_line:
            raise UserError(f"{path}, line {row.line}: qid {row.qid!r} appeared before (line "
                            f"{first_line[row.qid]}) and other questions' lines came between; keep each question's "
                            "candidate lines together, or give different questions different qids.")
        first_line.setdefault(row.qid, row.line)
        previous = row.qid


# ------------------------------------------------------------------------------------ the task
@TASKS.register("ranking")
class RankingTask(Task):
    """Answer ranking (DBQA): a pair classifier scores each question's candidate sentences; MRR and MAP."""

    Config = RankingTaskConfig
    head = "cls"
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.cls"})
    input_format = "label<TAB>qid<TAB>text_a<TAB>text_b, label 1 when text_b answers question text_a"

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        """Each question's candidate lines, together (cross-validation holds out whole questions)."""
        header, lines = read_tsv_lines(Path(source))
        columns = header.split("\t")
        if "qid" not in columns:
            raise UserError(f"{source}, line 1: the header {header!r} has no qid column; expected "
                            f"{chr(9).join(COLUMNS)}")
        at = columns.index("qid")
        groups: dict[str, list[str]] = {}
        for line in lines:
            fields = line.split("\t")
            groups.setdefault(fields[at] if at < len(fields) else "", []).append(line)
        return list(groups.values())

    @classmethod
    def write_examples(cls, source: Any, examples: Sequence[Any], out: Path) -> Path:
        return super().write_examples(source, [line for group in examples for line in group], out)
    metric_names = ("mrr", "map")

    def __init__(self, cfg: RankingTaskConfig, tokenizer, seq_length: int, state=None):
        from pentad.data.tsv import LabelMap

        self.label_map = LabelMap(["0", "1"], integer=True)
        self.objective = text_objective(tokenizer, seq_length)
        super().__init__(cfg, tokenizer, seq_length, state)

    def _rows(self, path: Path, with_labels: bool):
        from pentad.data.tsv import read_classification_tsv

        rows, columns = read_classification_tsv(
            path, with_labels=with_labels, known=COLUMNS, required=COLUMNS[1:],
            expected="label<TAB>qid<TAB>text_a<TAB>text_b" if with_labels else "qid<TAB>text_a<TAB>text_b")
        check_consecutive(rows, path)
        return rows, columns

    # ---------------------------------------------------------------- fitting and state
    def fit(self, train_path: Path) -> None:
        """Check the training file: labels 0/1, both present."""
        rows, _ = self._rows(train_path, with_labels=True)
        labels = {self.label_map.encode(r.label or "", train_path, r.line) for r in rows}
        if labels != {0, 1}:
            raise UserError(f"{train_path}: every candidate is labelled {labels.pop()}; training needs correct (1) "
                            "and wrong (0) candidates.")

    def state(self) -> dict[str, Any]:
        return {"kind": "ranking"}

    def describe(self) -> str:
        return "candidates scored by P(label 1), ranked per question"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "cls", "num_labels": 2, "pooling": self.cfg.pooling, "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- data
    # inference reads its input whole (no read_windows): a candidate's rank needs every candidate of its
    # question, and a question's lines need not be adjacent
    def read(self, path: Path, with_labels: bool = True) -> TextExamples:
        """The candidate pairs of a TSV file with their qids (``groups``); with labels, gold [N] 0/1."""
        from pentad.data.tsv import encode_classification

        rows, columns = self._rows(path, with_labels)
        labelled = with_labels and "label" in columns
        inputs = encode_classification(rows, self.tokenizer, self.seq_length, self.label_map if labelled else None,
                                       path=path)
        qids = [r.qid or "" for r in rows]
        gold = inputs.fields["label"] if labelled else None
        if gold is not None:
            skipped = unanswered(gold, qids)
            log.info(f"{path}: {len(question_groups(qids)):,} questions, {len(rows):,} candidates"
                     + (f"; {skipped:,} question(s) without a correct candidate are skipped by MRR and MAP"
                        if skipped else ""))
        return TextExamples(inputs, None, gold, line_numbers(rows), qids)

    def collate(self, instances: TextExamples, indices, rng: np.random.Generator):
        return collate_texts(self.objective, instances, indices, rng, self.head)

    def gold(self, instances: TextExamples) -> np.ndarray:
        if instances.gold is None:
            raise UserError("the evaluation file has no labels (a 'label' column).")
        return instances.gold

    # ---------------------------------------------------------------- evaluation and output
    def predict(self, model, instances: TextExamples, batch_size: int, device,
                progress: str | None = None) -> np.ndarray:
        """Each candidate's score [N]: the probability of label 1."""
        logits = predict_texts(self.objective, instances, self.head, model, batch_size, device, progress)
        return torch.softmax(logits.float(), dim=-1)[:, 1].double().numpy()

    def score(self, predictions: np.ndarray, instances: TextExamples, gold: np.ndarray) -> dict[str, float]:
        return ranking_metrics(predictions, gold, instances.groups or [])

    def write_predictions(self, path: Path, predictions: np.ndarray, instances: TextExamples,
                          probabilities: bool) -> None:
        """TSV with header ``qid<TAB>score<TAB>rank``, a line per input line: the candidate's question, its score
        (the probability that it answers; always written, so ``probabilities`` adds nothing) and its rank among
        its question's candidates (1 = best)."""
        from pentad.files import atomic_write_text

        qids = instances.groups or []
        ranks = np.zeros(len(qids), dtype=np.int64)
        for rows in question_groups(qids):
            ranks[rows[np.argsort(-predictions[rows], kind="stable")]] = np.arange(1, len(rows) + 1)
        lines = ["qid\tscore\trank"] + [f"{q}\t{s:.6f}\t{r}" for q, s, r in zip(qids, predictions, ranks)]
        atomic_write_text(path, "\n".join(lines) + "\n")
