"""Multiple choice (C3 and the like): a question over a context and its candidate answers -> ``choice`` head.

File format (TencentPretrain's ``run_c3`` format, the C3 release): one JSON list of documents, each
``[context, questions]`` or ``[context, questions, id]``::

    [
      [["男：听说你们公司要派你去南方工作?", "女：是呀，..."],           context: a list of sentences
       [{"question": "他们在谈论什么?", "choice": ["旅行", "环境", "工作", "家庭"],
         "answer": "工作"}],                                          answer: the right choice's text
       "47-275"],                                                      the document id (optional)
      ...
    ]

A question may carry its own ``"id"`` (C3's test set does); otherwise its id is ``<document id>-<n>``
(``n`` counting the document's questions from 0; the document id is its position in the list when it
has none). The answer is optional for inference input.

Each choice becomes one sequence ``[CLS] context [SEP] question choice [SEP]`` (segment 0 up to the
first [SEP], segment 1 after it); the context is truncated first (its end is dropped), then the
question, then the choice. A question's choices are padded with dummy ones to ``task.max_choices``
(``[CLS] [SEP]``, marked in ``Batch.group_padding_mask`` so that the head never picks them); a
batch of B questions holds B x max_choices sequences. The ``choice`` head scores each sequence and
takes a softmax over the question's choices. The metric is accuracy.

Predictions (``pentad infer``) are JSON lines ``{"id": ..., "label": index, "answer": text}`` (the
``id``/``label`` of TencentPretrain's ``run_c3_infer`` and the CLUE submission), with
``"probabilities"`` (one per choice) on request.

Shared with :mod:`pentad.tasks.chid`: :class:`ChoiceQuestions`, :class:`ChoiceTaskBase`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.components.base import Batch
from pentad.data.shards import Instances
from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.log import get_logger
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, in_order, predict_logits

log = get_logger(__name__)

HEAD = "choice"


class MultipleChoiceTaskConfig(TaskConfig):
    type: Literal["multiple_choice"] = "multiple_choice"
    max_choices: int = Field(4, ge=2, description="choices per question after padding with dummy choices (C3: "
                             "4); a question with more is an error")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["accuracy"] = Field("accuracy", description="dev metric that picks the best model")


@dataclass
class ChoiceQuestions:
    """Encoded multiple-choice questions, every one padded to ``width`` choices.

    choices: ``len(self) * width`` sequences, question q's choices at rows ``q*width ..
    q*width+width-1`` (dummy choices ``[CLS] [SEP]`` after the real ones), with the field ``split``
    (where segment 1 starts); counts [Q]: real choices per question; answers [Q]: the right choice's
    index (None when the file had no answers); ids: each question's id (for predictions); texts:
    each question's choice texts; groups [Q]: the questions that share candidates (ChID: one line),
    for an exclusive assignment of candidates to blanks.
    """

    choices: Instances
    counts: np.ndarray
    answers: np.ndarray | None
    ids: list[Any]
    texts: list[list[str]]
    groups: np.ndarray
    width: int

    def __len__(self) -> int:
        return len(self.counts)


def assemble_choice(context: Sequence[int], question: Sequence[int], choice: Sequence[int], cls_id: int,
                    sep_id: int, seq_length: int) -> tuple[np.ndarray, int]:
    """``[CLS] context [SEP] question choice [SEP]`` within ``seq_length`` tokens, and where segment 1
    starts. The context loses tokens first (from its end), then the question, then the choice."""
    budget = max(0, seq_length - 3)
    keep_choice = min(len(choice), budget)
    keep_question = min(len(question), budget - keep_choice)
    keep_context = min(len(context), budget - keep_choice - keep_question)
    seq = np.concatenate([[cls_id], np.asarray(context[:keep_context], dtype=np.int64), [sep_id],
                          np.asarray(question[:keep_question], dtype=np.int64),
                          np.asarray(choice[:keep_choice], dtype=np.int64), [sep_id]]).astype(np.int64)
    return seq, keep_context + 2


def special_ids(tokenizer: Any, task: str) -> tuple[int, int]:
    """The tokenizer's [CLS] and [SEP] ids (a UserError when it lacks them)."""
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        from pentad.data.masking import describe_tokenizer

        raise UserError(f"{task} needs [CLS] and [SEP] tokens, which the {describe_tokenizer(tokenizer)} lacks.")
    return int(tokenizer.cls_id), int(tokenizer.sep_id)


def load_json(path: Path, what: str, lines: bool = False) -> Any:
    """A JSON file (or, with ``lines``, a list of its JSON lines), with a UserError naming the file and
    line for a missing file or bad JSON."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e}).") from None
    if not lines:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}, line {e.lineno}, column {e.colno}: not valid JSON ({e.msg}); expected "
                            f"{what}.") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}, line {number}, column {e.colno}: not valid JSON ({e.msg}); expected "
                            f"{what}, one JSON object per line.") from None
    return out


class ChoiceTaskBase(Task):
    """What the multiple-choice tasks share: the ``choice`` head, batching padded choices, predicting
    logits [Q, max_choices], accuracy. Subclasses read their format into :class:`ChoiceQuestions`."""

    head = HEAD
    provides = frozenset({"tokens", "segments", "padding_mask", "group_padding_mask", f"labels.{HEAD}"})
    metric_names = ("accuracy",)

    def __init__(self, cfg: Any, tokenizer: Any, seq_length: int, state: dict[str, Any] | None = None):
        super().__init__(cfg, tokenizer, seq_length, state)
        self.pad_id = int(tokenizer.pad_id) if tokenizer.pad_id is not None else 0

    def describe(self) -> str:
        return f"questions padded to {self.cfg.max_choices} choices"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "choice", "name": self.head, "pooling": self.cfg.pooling, "dropout": self.cfg.head_dropout}]

    # ---------------------------------------------------------------- data
    def questions(self, contexts: list[list[int]], questions: list[list[int]], choices: list[list[list[int]]],
                  answers: list[int] | None, ids: list[Any], texts: list[list[str]], groups: Sequence[int],
                  where: list[str]) -> ChoiceQuestions:
        """Token ids of each question's context, question and choices -> :class:`ChoiceQuestions`
        (``where`` names each question in errors)."""
        cls_id, sep_id = special_ids(self.tokenizer, self.cfg.type)
        width = self.cfg.max_choices
        sequences: list[np.ndarray] = []
        splits: list[int] = []
        dummy = np.asarray([cls_id, sep_id], dtype=np.int64)
        for q, options in enumerate(choices):
            if len(options) > width:
                raise UserError(f"{where[q]}: {len(options)} choices, more than task.max_choices={width}; raise "
                                "task.max_choices (when fine-tuning: it sets how many choices every question "
                                "is padded to).")
            for option in options:
                seq, split = assemble_choice(contexts[q], questions[q], option, cls_id, sep_id, self.seq_length)
                sequences.append(seq)
                splits.append(split)
            sequences += [dummy] * (width - len(options))
            splits += [2] * (width - len(options))
        return ChoiceQuestions(
            Instances.from_sequences(sequences, split=splits), np.asarray([len(c) for c in choices], np.int64),
            None if answers is None else np.asarray(answers, np.int64), ids, texts,
            np.asarray(groups, np.int64), width)

    def collate(self, instances: ChoiceQuestions, indices: Sequence[int], rng: np.random.Generator) -> Batch:
        """Questions ``indices`` -> tokens/segments/padding_mask [B*C,S], group_padding_mask [B,C] and
        labels.choice [B] (when the questions have answers)."""
        from pentad.data.objectives.base import segments_from_split

        index = np.asarray(indices, dtype=np.int64)
        width = instances.width
        rows = (index[:, None] * width + np.arange(width)[None, :]).reshape(-1)
        part = instances.choices[rows]
        ids, valid = part.padded(self.pad_id)
        batch = Batch(tokens=torch.from_numpy(ids),
                      segments=torch.from_numpy(segments_from_split(part.fields["split"], valid)),
                      padding_mask=torch.from_numpy(~valid),
                      group_padding_mask=torch.from_numpy(np.arange(width)[None, :] >= instances.counts[index, None]))
        if instances.answers is not None:
            batch.labels[self.head] = torch.from_numpy(instances.answers[index])
        return batch

    def gold(self, instances: ChoiceQuestions) -> np.ndarray:
        if instances.answers is None:
            raise ValueError("the questions were read without answers")
        return instances.answers

    # ---------------------------------------------------------------- prediction and evaluation
    def predict(self, model, instances: ChoiceQuestions, batch_size: int, device,
                progress: str | None = None) -> torch.Tensor:
        """The head's logits [Q, max_choices] (dummy choices at the lowest finite value)."""
        rng = np.random.default_rng(0)
        batches = (self.collate(instances, idx, rng) for idx in in_order(len(instances), batch_size, progress))
        logits = predict_logits(model, batches, self.head, device)
        return logits if len(logits) else torch.empty(0, instances.width)

    def choose(self, logits: torch.Tensor, instances: ChoiceQuestions) -> np.ndarray:
        """The chosen choice of each question (default: the highest score)."""
        return logits.argmax(-1).numpy()

    def probabilities(self, logits: torch.Tensor, instances: ChoiceQuestions) -> list[list[float]]:
        """Each question's softmax over its real choices."""
        probs = torch.softmax(logits.float(), dim=-1).numpy()
        return [[float(p) for p in row[:int(n)]] for row, n in zip(probs, instances.counts)]

    def score(self, predictions: torch.Tensor, instances: ChoiceQuestions, gold: np.ndarray) -> dict[str, float]:
        chosen = self.choose(predictions, instances)
        return {"accuracy": float((chosen == gold).mean()) if len(gold) else 0.0}

    predictions_file = "predictions.jsonl"

    def write_predictions(self, path: Path, logits: torch.Tensor, instances: ChoiceQuestions,
                          probabilities: bool) -> None:
        """JSON lines ``{"id", "label", "answer"}`` (and ``"probabilities"`` on request)."""
        from pentad.files import atomic_write_text

        chosen = self.choose(logits, instances)
        probs = self.probabilities(logits, instances) if probabilities else None
        lines = []
        for q, label in enumerate(chosen):
            record: dict[str, Any] = {"id": instances.ids[q], "label": int(label),
                                      "answer": instances.texts[q][int(label)]}
            if probs is not None:
                record["probabilities"] = [round(p, 6) for p in probs[q]]
            lines.append(json.dumps(record, ensure_ascii=False))
        atomic_write_text(path, "".join(line + "\n" for line in lines))


@TASKS.register("multiple_choice")
class MultipleChoiceTask(ChoiceTaskBase):
    """Multiple-choice reading comprehension (C3): each choice scored with its context and question.

    A softmax over a question's choices; dummy choices pad every question to task.max_choices.
    """

    Config = MultipleChoiceTaskConfig
    input_format = "JSON [[context sentences], [{question, choice: [...], answer}], id] (C3)"

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        """The documents (a document's questions stay in one fold)."""
        data = load_json(Path(source), "a C3-format JSON list of [context sentences, questions, id] documents")
        if not isinstance(data, list):
            raise UserError(f"{source}: expected a JSON list of documents [[context sentences], [questions], id], "
                            f"found {type(data).__name__}.")
        return data

    @classmethod
    def write_examples(cls, source: Any, examples: Sequence[Any], out: Path) -> Path:
        from pentad.files import atomic_write_text

        path = out.with_suffix(".json")
        atomic_write_text(path, json.dumps(list(examples), ensure_ascii=False))
        return path

    # inference reads its input whole (no read_windows): the input is one JSON document (json.load)
    def read(self, path: Path, with_labels: bool = True) -> ChoiceQuestions:
        data = load_json(path, "a C3-format JSON list of [context sentences, questions, id] documents")
        if not isinstance(data, list):
            raise UserError(f"{path}: expected a JSON list of documents [[context sentences], [questions], id], "
                            f"found a {type(data).__name__}.")
        contexts, questions, choices, answers, ids, texts, groups, where = [], [], [], [], [], [], [], []
        for d, doc in enumerate(data):
            doc_id = doc[2] if isinstance(doc, list) and len(doc) == 3 else d
            at = f"{path}, document {d}" + (f" (id {doc_id})" if doc_id != d else "")
            if not isinstance(doc, list) or len(doc) not in (2, 3):
                raise UserError(f"{at}: expected [[context sentences], [questions]] or [[context sentences], "
                                f"[questions], id], found {_show(doc)}.")
            context, items = doc[0], doc[1]
            if not isinstance(context, list) or not all(isinstance(s, str) for s in context):
                raise UserError(f"{at}: the context (first element) must be a list of strings, found "
                                f"{_show(context)}.")
            if not isinstance(items, list):
                raise UserError(f"{at}: the questions (second element) must be a list of objects {{question, "
                                f"choice, answer}}, found {_show(items)}.")
            for n, item in enumerate(items):
                qid = item.get("id", f"{doc_id}-{n}") if isinstance(item, dict) else f"{doc_id}-{n}"
                here = f"{at}, question {n} (id {qid})"
                answer = _check_question(item, here, with_labels)
                contexts.append("\n".join(context))
                questions.append(item["question"])
                choices.append(item["choice"])
                texts.append(list(item["choice"]))
                answers.append(answer)
                ids.append(qid)
                groups.append(d)
                where.append(here)
        if not questions:
            raise UserError(f"{path}: no questions (expected a JSON list of documents [[context sentences], "
                            "[{question, choice, answer}, ...], id]).")
        encode = self.tokenizer.encode_batch
        flat = [c for options in choices for c in options]
        encoded = iter(encode(flat))
        choice_ids = [[next(encoded) for _ in options] for options in choices]
        out = self.questions(encode(contexts), encode(questions), choice_ids, answers if with_labels else None,
                             ids, texts, groups, where)
        log.info(f"{path}: {len(out):,} questions in {len(data):,} documents")
        return out


def _check_question(item: Any, here: str, with_labels: bool) -> int:
    """Check one question object; return the answer's index among its choices (-1 without labels)."""
    if not isinstance(item, dict):
        raise UserError(f"{here}: expected an object {{\"question\": ..., \"choice\": [...], \"answer\": ...}}, "
                        f"found {_show(item)}.")
    if not isinstance(item.get("question"), str):
        raise UserError(f"{here}: \"question\" must be a string, found {_show(item.get('question'))}.")
    options = item.get("choice")
    if not isinstance(options, list) or not options or not all(isinstance(c, str) for c in options):
        raise UserError(f"{here}: \"choice\" must be a non-empty list of strings, found {_show(options)}.")
    if not with_labels:
        return -1
    if "answer" not in item:
        raise UserError(f"{here}: no \"answer\"; training and evaluation files need the right choice's text "
                        "(an inference input may leave it out).")
    answer = item["answer"]
    if not isinstance(answer, str) or answer.strip() not in [c.strip() for c in options]:
        raise UserError(f"{here}: the answer {answer!r} is not among the choices {options}; the answer must be "
                        "the text of one choice.")
    return [c.strip() for c in options].index(answer.strip())


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."
