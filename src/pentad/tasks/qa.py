"""Span-extraction question answering (CMRC 2018, SQuAD): JSON -> sliding windows -> ``span`` head.

File format (SQuAD's JSON, as TencentPretrain's ``run_cmrc`` reads it)::

    {"data": [{"paragraphs": [{"context": "...",
                               "qas": [{"id": "DEV_0_QUERY_0", "question": "...",
                                        "answers": [{"text": "...", "answer_start": 11}, ...]}]}]}]}

A question enters the model as ``[CLS] question [SEP] window [SEP]`` (segments 0, then 1), where a
window is a stretch of the context's tokens: a context longer than ``seq_length`` allows is cut into
windows that start ``doc_stride`` tokens apart (so they overlap when the stride is shorter than a
window), and a question longer than ``max_question_length`` tokens is cut. Training teaches the start
and end token of the answer in each window that holds the whole answer, and the first token ([CLS],
position 0) in the windows that do not. The answer trained on is the first of a question's answers
found at its ``answer_start``; the others (CMRC 2018 has three per dev question, some without a
position) count only as references in evaluation.

Prediction looks at every window of a question: the ``n_best`` best starts and ends of each window
are paired (start before end, at most ``max_answer_length`` tokens; a start only at a token this
window gives the most context, as BERT's SQuAD code does with overlapping windows), a pair scores
the sum of its start and end logits, and the best pair over all windows is the answer, mapped back through the
tokenizer's character offsets to the exact substring of the context. Its probability is the softmax
of its score among the ``n_best`` best candidates of the question.

Evaluation follows the official CMRC 2018 script: the text is lower-cased and stripped; Chinese
characters and punctuation are segments of their own and other runs of characters are split into
words; F1 is the longest common run of segments between prediction and reference (punctuation
removed) against their lengths, and EM compares the texts with punctuation removed; both take the
best reference of each question and are averaged over the questions (fractions, where the official
script prints percentages).
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

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.log import get_logger
from pentad.registry import TASKS
from pentad.tasks.base import Task, TaskConfig, in_order

log = get_logger(__name__)


class QaTaskConfig(TaskConfig):
    type: Literal["qa"] = "qa"
    doc_stride: int = Field(128, ge=1, description="tokens between the starts of a long context's windows "
                            "(TencentPretrain's --doc_stride)")
    max_question_length: int = Field(64, ge=1, description="questions are cut to this many tokens")
    max_answer_length: int = Field(64, ge=1, description="longest answer predicted, in tokens")
    n_best: int = Field(20, ge=1, description="best starts and ends of each window paired in prediction; "
                        "the answer's probability is taken among this many candidates")
    on_bad_answer: Literal["fail", "skip"] = Field(
        "fail", description="a question none of whose answers is found at its answer_start in the context: "
        "fail (an error naming the file and question id) or skip (left out of the file's questions, counted)")
    metric: Literal["f1", "em"] = Field("f1", description="dev metric that picks the best model")


@dataclass(frozen=True)
class Question:
    """One question of a file. ``answers``: every reference text (empty without labels); ``start`` /
    ``end``: the characters of the context holding the answer trained on (end exclusive; None
    without labels); ``where``: its place in the JSON (``data[0].paragraphs[1].qas[2]``)."""

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    start: int | None
    end: int | None
    where: str


@dataclass
class QaWindows:
    """Encoded windows (one model row each). tokens[w]: ``[CLS] q [SEP] window [SEP]``;
    context_begin[w]: the position of the window's first context token; offsets[w]: [n, 2] the
    characters of the context each of its n context tokens covers; max_context[w]: [n] whether
    this window, of all the question's windows holding the token, gives the token the most context
    on its narrower side (BERT's rule for overlapping windows; an answer starts only there);
    question_of[w]: the index of its question in ``questions``; labels: [W, 2] start and end
    positions (None without labels)."""

    questions: list[Question]
    tokens: list[np.ndarray]
    context_begin: np.ndarray
    offsets: list[np.ndarray]
    max_context: list[np.ndarray]
    question_of: np.ndarray
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class QaPredictions:
    """Per question (in ``QaWindows.questions`` order): the answer text (empty when no window holds
    a context token) and its probability among the question's n-best candidates."""

    answers: list[str]
    probabilities: list[float]


# ------------------------------------------------------------------------------------ reading
def _expect(value: Any, kind: type | tuple[type, ...], path: Path, where: str, what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        found = "nothing (the key is missing)" if value is None else f"{type(value).__name__} {str(value)[:60]!r}"
        raise UserError(f"{path}, {where}: expected {what} ({names}), found {found}.")
    return value


def read_squad(path: Path, with_labels: bool, on_bad_answer: str = "fail") -> tuple[list[Question], list[str]]:
    """The questions of a SQuAD/CMRC JSON file, checked, and the ids of those skipped for a bad answer
    (``on_bad_answer="skip"``). Without labels, answers are not read."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); expected SQuAD/CMRC 2018 JSON "
                        '{"data": [{"paragraphs": [{"context": ..., "qas": [...]}]}]}.') from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise UserError(f"{path}: expected SQuAD/CMRC 2018 JSON, an object whose \"data\" is a list of articles "
                        f"{{\"paragraphs\": [...]}}; found {str(data)[:80]!r}.")
    questions: list[Question] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}
    for a, article in enumerate(data["data"]):
        article = _expect(article, dict, path, f"data[{a}]", "an article object")
        paragraphs = _expect(article.get("paragraphs"), list, path, f"data[{a}].paragraphs", "a list of paragraphs")
        for p, para in enumerate(paragraphs):
            where_p = f"data[{a}].paragraphs[{p}]"
            para = _expect(para, dict, path, where_p, "a paragraph object")
            context = _expect(para.get("context"), str, path, f"{where_p}.context", "the context text")
            qas = _expect(para.get("qas"), list, path, f"{where_p}.qas", "a list of questions")
            for q, qa in enumerate(qas):
                where = f"{where_p}.qas[{q}]"
                qa = _expect(qa, dict, path, where, "a question object")
                qid = str(_expect(qa.get("id"), (str, int), path, f"{where}.id", "the question id"))
                text = _expect(qa.get("question"), str, path, f"{where}.question", "the question text")
                if qid in seen:
                    raise UserError(f"{path}: the question id {qid!r} appears twice ({seen[qid]} and {where}); "
                                    "predictions are keyed by id, so ids must be unique.")
                seen[qid] = where
                if not with_labels:
                    questions.append(Question(qid, text, context, (), None, None, where))
                    continue
                answers = _expect(qa.get("answers"), list, path, f"{where}.answers", "a list of answers")
                texts, located = [], None
                for k, ans in enumerate(answers):
                    ans = _expect(ans, dict, path, f"{where}.answers[{k}]", "an answer object")
                    answer = _expect(ans.get("text"), str, path, f"{where}.answers[{k}].text", "the answer text")
                    begin = _expect(ans.get("answer_start"), int, path, f"{where}.answers[{k}].answer_start",
                                    "the answer's first character in the context")
                    texts.append(answer)
                    if located is None and answer.strip() and 0 <= begin \
                            and context[begin:begin + len(answer)] == answer:
                        located = (begin, begin + len(answer))
                if located is None:
                    if on_bad_answer == "skip":
                        skipped.append(qid)
                        continue
                    raise UserError(_bad_answer(path, qid, where, context, answers))
                questions.append(Question(qid, text, context, tuple(texts), located[0], located[1], where))
    return questions, skipped


def _bad_answer(path: Path, qid: str, where: str, context: str, answers: list[dict]) -> str:
    if not answers:
        found = "it has no answers"
    else:
        first = answers[0]
        begin, answer = first["answer_start"], first["text"]
        there = context[begin:begin + len(answer)] if 0 <= begin < len(context) else "(outside the context)"
        found = f"its first answer {answer!r} at answer_start {begin}, where the context has {there!r}"
        if len(answers) > 1:
            found += f" (and none of its other {len(answers) - 1} answer(s) is found either)"
    return (f"{path}: question {qid!r} ({where}): no answer is found at its answer_start in the context: {found}. "
            "Fix the file, or set task.on_bad_answer=skip to leave such questions out (they are counted).")


# ------------------------------------------------------------------------------------ encoding
def encode_windows(questions: Sequence[Question], tokenizer: Any, seq_length: int, doc_stride: int,
                   max_question_length: int, labelled: bool, path: Path | str = "<questions>") -> QaWindows:
    """Questions -> windows (see the module docstring). A question whose answer covers no token
    (whitespace only) is an error naming it."""
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    if cls_id is None or sep_id is None:
        raise UserError("the qa task builds [CLS] question [SEP] context [SEP], but the tokenizer has no "
                        f"{'[CLS]' if cls_id is None else '[SEP]'} token; name one with tokenizer.special_tokens.")
    contexts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    tokens, begins, offsets, best, owner, labels = [], [], [], [], [], []
    for qi, question in enumerate(questions):
        if question.context not in contexts:
            ids, offs = tokenizer.encode_with_offsets(question.context)
            contexts[question.context] = (np.asarray(ids, dtype=np.int64),
                                          np.asarray(offs, dtype=np.int64).reshape(-1, 2))
        ctx_ids, ctx_offs = contexts[question.context]
        q_ids = tokenizer.encode(question.question)[:max_question_length]
        head = [int(cls_id), *q_ids, int(sep_id)]
        budget = seq_length - len(head) - 1
        if budget < 1:
            raise UserError(f"seq_length {seq_length} leaves no room for the context after a question of "
                            f"{len(q_ids)} tokens ({path}, question {question.id!r}); raise the model's sequence "
                            "length or lower task.max_question_length.")
        answer = None
        if labelled and question.start is not None:
            overlap = np.nonzero((ctx_offs[:, 1] > question.start) & (ctx_offs[:, 0] < question.end))[0]
            if not len(overlap):
                raise UserError(f"{path}: question {question.id!r} ({question.where}): its answer "
                                f"{question.context[question.start:question.end]!r} covers no token of the context.")
            answer = (int(overlap[0]), int(overlap[-1]))
        n = len(ctx_ids)
        begin = 0
        spans = []
        while True:
            spans.append((begin, min(budget, n - begin)))
            length = min(budget, n - begin)
            window = np.asarray(head + ctx_ids[begin:begin + length].tolist() + [int(sep_id)], dtype=np.int64)
            tokens.append(window)
            begins.append(len(head))
            offsets.append(ctx_offs[begin:begin + length])
            owner.append(qi)
            if answer is not None:
                inside = begin <= answer[0] and answer[1] < begin + length
                labels.append((len(head) + answer[0] - begin, len(head) + answer[1] - begin) if inside else (0, 0))
            if begin + length >= n:
                break
            begin += min(length, doc_stride)
        best += _max_context(spans, n)
    return QaWindows(list(questions), tokens, np.asarray(begins, dtype=np.int64), offsets, best,
                     np.asarray(owner, dtype=np.int64),
                     np.asarray(labels, dtype=np.int64).reshape(-1, 2) if labelled else None)


def _max_context(spans: Sequence[tuple[int, int]], n: int) -> list[np.ndarray]:
    """Per window ``(begin, length)`` of a context of ``n`` tokens: whether it is the window where each
    of its tokens has the most context, ``min(tokens left, tokens right) + 0.01 * length`` (the first
    such window on a tie), as BERT's SQuAD code chooses."""
    position = np.arange(n)
    score = np.full((len(spans), n), -np.inf)
    for w, (begin, length) in enumerate(spans):
        inside = slice(begin, begin + length)
        score[w, inside] = np.minimum(position[inside] - begin, begin + length - 1 - position[inside]) + 0.01 * length
    winner = score.argmax(axis=0) if n else position
    return [winner[begin:begin + length] == w for w, (begin, length) in enumerate(spans)]


# ------------------------------------------------------------------------------------ metrics
# The official CMRC 2018 punctuation list (its '……' never equals one character, so '…' stays).
PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_WORD = re.compile(r"\d+(?:[.,]\d+)+|\w+|[^\w\s]")


def _is_chinese(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fa5"


def segments(text: str, drop_punctuation: bool = True) -> list[str]:
    """The official script's ``mixed_segmentation``: lower-cased and stripped; each Chinese character
    (U+4E00-U+9FA5) and punctuation mark is a segment; other runs are split into words (the official
    script uses NLTK's word tokenizer; here words, numbers with their decimal points, and single other
    symbols, which agree with it except on English contractions and abbreviations). With
    ``drop_punctuation``, punctuation is left out and does not break a run."""
    out: list[str] = []
    run = ""
    for char in text.lower().strip():
        if drop_punctuation and char in PUNCTUATION:
            continue
        if _is_chinese(char) or char in PUNCTUATION:
            if run:
                out += _WORD.findall(run)
                run = ""
            out.append(char)
        else:
            run += char
    if run:
        out += _WORD.findall(run)
    return out


def _longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common contiguous run of segments (the official ``find_lcs``)."""
    best = 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def f1_score(references: Sequence[str], prediction: str) -> float:
    """The best F1 over the references (CMRC 2018 rules; 0 without references)."""
    predicted = segments(prediction)
    best = 0.0
    for reference in references:
        gold = segments(reference)
        common = _longest_common_run(gold, predicted)
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _without_punctuation(text: str) -> str:
    return "".join(c for c in text.lower().strip() if c not in PUNCTUATION)


def exact_match(references: Sequence[str], prediction: str) -> float:
    """1.0 when the prediction equals a reference once lower-cased, stripped and without punctuation."""
    predicted = _without_punctuation(prediction)
    return float(any(_without_punctuation(r) == predicted for r in references))


def qa_metrics(gold: Sequence[Sequence[str]], predicted: Sequence[str]) -> dict[str, float]:
    """Mean F1 and EM over the questions (fractions in [0, 1])."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} questions but {len(predicted)} predictions")
    n = len(gold)
    if not n:
        return {"f1": 0.0, "em": 0.0}
    return {"f1": sum(f1_score(g, p) for g, p in zip(gold, predicted)) / n,
            "em": sum(exact_match(g, p) for g, p in zip(gold, predicted)) / n}


# ------------------------------------------------------------------------------------ the task
@TASKS.register("qa")
class QaTask(Task):
    """Span-extraction QA (CMRC 2018, SQuAD): answer spans over sliding windows of long contexts."""

    Config = QaTaskConfig
    head = "span"
    provides = frozenset({"tokens", "segments", "padding_mask", "labels.span"})
    input_format = "SQuAD/CMRC 2018 JSON: data -> paragraphs -> context, qas (id, question, answers)"

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        """The paragraphs with their article's title (a context's questions stay in one fold)."""
        read_squad(Path(source), with_labels=False)  # the layout checked, with errors naming where
        data = json.loads(Path(source).read_text(encoding="utf-8"))
        return [(article.get("title"), para) for article in data["data"] for para in article["paragraphs"]]

    @classmethod
    def write_examples(cls, source: Any, examples: Sequence[Any], out: Path) -> Path:
        from pentad.files import atomic_write_text

        articles: list[dict[str, Any]] = []
        for title, para in examples:  # consecutive paragraphs of one article stay one article
            if not articles or articles[-1].get("title") != title:
                articles.append({"title": title, "paragraphs": []} if title is not None else {"paragraphs": []})
            articles[-1]["paragraphs"].append(para)
        path = out.with_suffix(".json")
        atomic_write_text(path, json.dumps({"version": "pentad-fold", "data": articles}, ensure_ascii=False))
        return path
    metric_names = ("f1", "em")

    def __init__(self, cfg: QaTaskConfig, tokenizer, seq_length: int, state=None):
        super().__init__(cfg, tokenizer, seq_length, state)
        self.pad_id = int(tokenizer.pad_id if tokenizer.pad_id is not None else 0)

    def describe(self) -> str:
        return (f"windows of {self.seq_length} tokens, doc_stride {self.cfg.doc_stride}, questions cut to "
                f"{self.cfg.max_question_length} tokens, answers up to {self.cfg.max_answer_length} tokens")

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "span"}]

    # ---------------------------------------------------------------- data
    # inference reads its input whole (no read_windows): one JSON document in, one out, and a question's
    # windows are mapped back to it across the document
    def read(self, path: Path, with_labels: bool = True) -> QaWindows:
        questions, skipped = read_squad(path, with_labels, self.cfg.on_bad_answer)
        if skipped:
            log.info(f"{path}: skipped {len(skipped):,} question(s) with no answer found at its answer_start "
                     f"(task.on_bad_answer=skip): {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}")
        if not questions:
            left = f" ({len(skipped):,} skipped for a bad answer)" if skipped else ""
            raise UserError(f"{path} holds no questions{left}; expected SQuAD/CMRC 2018 JSON with "
                            "data -> paragraphs -> qas.")
        windows = encode_windows(questions, self.tokenizer, self.seq_length, self.cfg.doc_stride,
                                 self.cfg.max_question_length, with_labels, path)
        log.info(f"{path}: {len(questions):,} questions in {len(windows):,} windows")
        return windows

    def collate(self, instances: QaWindows, indices, rng: np.random.Generator) -> Batch:
        chosen = [int(i) for i in indices]
        width = max(len(instances.tokens[i]) for i in chosen)
        tokens = np.full((len(chosen), width), self.pad_id, dtype=np.int64)
        segments_ = np.zeros((len(chosen), width), dtype=np.int64)
        padding = np.ones((len(chosen), width), dtype=bool)
        for r, i in enumerate(chosen):
            n = len(instances.tokens[i])
            tokens[r, :n], padding[r, :n] = instances.tokens[i], False
            segments_[r, instances.context_begin[i]:n] = 1
        batch = Batch(tokens=torch.from_numpy(tokens), segments=torch.from_numpy(segments_),
                      padding_mask=torch.from_numpy(padding))
        if instances.labels is not None:
            batch.labels[self.head] = torch.from_numpy(instances.labels[chosen])
        return batch

    def num_predictions(self, instances: QaWindows) -> int:
        return len(instances.questions)

    def gold(self, instances: QaWindows) -> list[tuple[str, ...]]:
        if instances.labels is None:
            raise UserError("the evaluation file was read without answers.")
        return [q.answers for q in instances.questions]

    # ---------------------------------------------------------------- evaluation and output
    @torch.no_grad()
    def predict(self, model, instances: QaWindows, batch_size: int, device,
                progress: str | None = None) -> QaPredictions:
        """The best answer of each question over all its windows (see the module docstring)."""
        n_best, longest = self.cfg.n_best, self.cfg.max_answer_length
        candidates: list[dict[tuple[int, int], float]] = [{} for _ in instances.questions]
        was_training = model.training
        model.eval()
        try:
            for idx in in_order(len(instances), batch_size, progress):
                batch = self.collate(instances, idx, np.random.default_rng(0)).to(device)
                batch.labels = {}
                logits = model(batch)[self.head].logits.float().cpu().numpy()
                for r, w in enumerate(idx):
                    offs = instances.offsets[int(w)]
                    begin, n = int(instances.context_begin[int(w)]), len(offs)
                    if not n:
                        continue
                    start, end = logits[r, begin:begin + n, 0], logits[r, begin:begin + n, 1]
                    allowed = instances.max_context[int(w)]
                    start = np.where(allowed, start, -np.inf)
                    k = min(n_best, n)
                    starts = np.argpartition(-start, k - 1)[:k]
                    ends = np.argpartition(-end, k - 1)[:k]
                    s, e = np.meshgrid(starts, ends, indexing="ij")
                    ok = (e >= s) & (e - s < longest) & allowed[s]
                    found = candidates[int(instances.question_of[int(w)])]
                    for i, j in zip(s[ok].tolist(), e[ok].tolist()):
                        span = (int(offs[i, 0]), int(offs[j, 1]))
                        score = float(start[i] + end[j])
                        if score > found.get(span, -np.inf):
                            found[span] = score
        finally:
            model.train(was_training)
        out = QaPredictions([], [])
        for question, found in zip(instances.questions, candidates):
            if not found:
                out.answers.append("")
                out.probabilities.append(0.0)
                continue
            ranked = sorted(found.items(), key=lambda item: -item[1])[:n_best]
            scores = np.array([score for _, score in ranked])
            probs = np.exp(scores - scores.max())
            (begin, end), _ = ranked[0]
            out.answers.append(question.context[begin:end].strip())  # byte-level BPE offsets hold the space
            out.probabilities.append(float(probs[0] / probs.sum()))
        return out

    def score(self, predictions: QaPredictions, instances: QaWindows, gold) -> dict[str, float]:
        return qa_metrics(gold, predictions.answers)

    predictions_file = "predictions.json"

    def write_predictions(self, path: Path, predictions: QaPredictions, instances: QaWindows,
                          probabilities: bool) -> None:
        """JSON ``{question id: answer text}`` (the official CMRC 2018 / SQuAD prediction file); with
        probabilities ``{question id: {"answer": text, "probability": p}}``."""
        from pentad.files import atomic_write_text

        if probabilities:
            out: dict[str, Any] = {q.id: {"answer": a, "probability": round(p, 6)} for q, a, p in
                                   zip(instances.questions, predictions.answers, predictions.probabilities)}
        else:
            out = {q.id: a for q, a in zip(instances.questions, predictions.answers)}
        atomic_write_text(path, json.dumps(out, ensure_ascii=False, indent=2) + "\n")
