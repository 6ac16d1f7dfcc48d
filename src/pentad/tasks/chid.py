"""Idiom cloze (ChID): each ``#idiomNNNNNN#`` blank of a passage is a multiple-choice question.

File format (TencentPretrain's ``run_chid`` format, the ChID release in CLUE): one JSON object per
line, the passages of ``content`` holding blanks and the candidate idioms shared by all of them::

    {"content": ["……他们#idiom000001#地讨论着……", "……"], "candidates": ["津津有味", "一丝不苟", ...]}

The answers are a separate JSON object ``{"#idiom000001#": 3, ...}`` (the right candidate's index)
in ``<name>_answer.json`` next to the data file (``train.json`` -> ``train_answer.json``, CLUE's
layout; TencentPretrain takes its path as ``--train_answer_path``). Inference input needs none.

Each blank becomes one question: a window of the passage around it (as many tokens as fit beside
the longest candidate, centred on the blank), the blank itself as ``task.blank_tokens`` mask tokens
and every other blank in the window as the unknown token; each candidate is scored with it as
``[CLS] window [SEP] candidate [SEP]`` by the ``choice`` head (see :mod:`pentad.tasks.multiple_choice`).

``task.exclusive`` (default, as TencentPretrain's ``run_chid_infer`` does): the blanks of one line
never share a candidate; the pairs (blank, candidate) are taken greedily by probability, highest
first. Accuracy is over blanks, with the same assignment. Predictions are a JSON object
``{"#idiom000001#": index, ...}`` (the answer file's layout); with probabilities, each value is
``{"label": index, "probabilities": [...]}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from pentad.errors import UserError
from pentad.layers.pooling import PoolingKind
from pentad.log import get_logger
from pentad.registry import TASKS
from pentad.tasks.base import TaskConfig
from pentad.tasks.multiple_choice import ChoiceQuestions, ChoiceTaskBase, load_json

log = get_logger(__name__)

BLANK = re.compile(r"(#idiom\d+#)")


class ChidTaskConfig(TaskConfig):
    type: Literal["chid"] = "chid"
    max_choices: int = Field(10, ge=2, description="candidates per blank after padding with dummy choices "
                             "(ChID: 10); a line with more candidates is an error")
    blank_tokens: int = Field(4, ge=1, description="mask tokens that stand for the blank (an idiom has 4 "
                              "characters)")
    exclusive: bool = Field(True, description="the blanks of one line take different candidates (greedy by "
                            "probability); false: each blank takes its most probable candidate")
    pooling: PoolingKind = "first"
    head_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    metric: Literal["accuracy"] = Field("accuracy", description="dev metric that picks the best model")


def answer_path(path: Path) -> Path:
    """Where the answers of a ChID data file are: ``<name>_answer.json`` beside it."""
    path = Path(path)
    return path.with_name(f"{path.stem}_answer.json")


def window(left: list[int], right: list[int], size: int) -> tuple[list[int], list[int]]:
    """The last tokens of ``left`` and the first of ``right``, ``size`` in all (or all there is),
    split evenly when both sides have enough."""
    take_left = min(len(left), size // 2)
    take_right = min(len(right), size - take_left)
    take_left = min(len(left), size - take_right)
    return left[len(left) - take_left:], right[:take_right]


@TASKS.register("chid")
class ChidTask(ChoiceTaskBase):
    """Chinese idiom cloze (ChID): pick the idiom for each blank of a passage among the candidates.

    Each blank is a multiple-choice question over the line's candidates; the blanks of a line take
    different idioms.
    """

    Config = ChidTaskConfig
    input_format = "JSON lines {content: [passages with #idiomN# blanks], candidates}; answers in <name>_answer.json"

    @classmethod
    def examples(cls, source: Any) -> list[Any]:
        """The lines (a line's blanks, which share candidates, stay in one fold)."""
        return [record for _, record in load_json(Path(source), "a ChID line {\"content\": [...], \"candidates\": "
                                                  "[...]}", lines=True)]

    @classmethod
    def write_examples(cls, source: Any, examples: list[Any], out: Path) -> Path:
        """The lines, and beside them their blanks' answers (``<name>_answer.json``)."""
        from pentad.files import atomic_write_text

        path = out.with_suffix(".json")
        answers_file = answer_path(Path(source))
        answers = load_json(answers_file, "a JSON object {\"#idiom000001#\": index}") if answers_file.is_file() else {}
        tags = {tag for record in examples if isinstance(record, dict)
                for passage in record.get("content") or [] if isinstance(passage, str)
                for tag in BLANK.findall(passage)}
        atomic_write_text(answer_path(path), json.dumps({t: v for t, v in answers.items() if t in tags},
                                                        ensure_ascii=False))
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in examples))
        return path

    # inference reads its input whole (no read_windows): a JSON document in and out, and each passage's
    # blanks share its candidate idioms (answers assigned jointly)
    def read(self, path: Path, with_labels: bool = True) -> ChoiceQuestions:
        tokenizer = self.tokenizer
        if tokenizer.mask_id is None:
            from pentad.data.masking import describe_tokenizer

            raise UserError(f"chid marks the blank with mask tokens, which the {describe_tokenizer(tokenizer)} "
                            "lacks.")
        mask = int(tokenizer.mask_id)
        other = int(tokenizer.unk_id) if tokenizer.unk_id is not None else mask
        lines = load_json(path, "a ChID line {\"content\": [...], \"candidates\": [...]}", lines=True)
        if not lines:
            raise UserError(f"{path}: no lines (expected one JSON object {{\"content\": [...], \"candidates\": "
                            "[...]}} per line).")
        answers = self._answers(path) if with_labels else None
        # blanks: (line number, passage pieces, which blank, candidates)
        blanks: list[tuple[int, list[str], int, list[str]]] = []
        seen: dict[str, int] = {}
        for number, record in lines:
            at = f"{path}, line {number}"
            if not isinstance(record, dict):
                raise UserError(f"{at}: expected an object {{\"content\": [...], \"candidates\": [...]}}, found "
                                f"{type(record).__name__}.")
            content, candidates = record.get("content"), record.get("candidates")
            if not isinstance(content, list) or not all(isinstance(p, str) for p in content):
                raise UserError(f"{at}: \"content\" must be a list of passages (strings), found {content!r:.80}.")
            if not isinstance(candidates, list) or not candidates or not all(isinstance(c, str) for c in candidates):
                raise UserError(f"{at}: \"candidates\" must be a non-empty list of strings, found "
                                f"{candidates!r:.80}.")
            found = 0
            for passage in content:
                pieces = BLANK.split(passage)  # text, tag, text, tag, ..., text
                for k in range(1, len(pieces), 2):
                    tag = pieces[k]
                    if tag in seen:
                        raise UserError(f"{at}: the blank {tag} already appears on line {seen[tag]}; every blank "
                                        "needs its own tag (predictions and answers are keyed by it).")
                    seen[tag] = number
                    blanks.append((number, pieces, k, candidates))
                    found += 1
            if not found:
                raise UserError(f"{at}: no blank (#idiom<digits>#) in \"content\"; every line needs at least one.")
        # Every text piece and candidate tokenized once.
        texts = sorted({p for _, pieces, _, _ in blanks for p in pieces[0::2]}
                       | {c for _, _, _, cands in blanks for c in cands})
        ids = dict(zip(texts, self.tokenizer.encode_batch(texts)))
        contexts, choices, gold, tags, groups, where, options = [], [], [], [], [], [], []
        for number, pieces, k, candidates in blanks:
            tag = pieces[k]
            where.append(f"{path}, line {number}, blank {tag}")
            cand_ids = [ids[c] for c in candidates]
            room = self.seq_length - 3 - max(len(c) for c in cand_ids) - self.cfg.blank_tokens
            if room < 0:
                raise UserError(f"{where[-1]}: the longest candidate ({max(len(c) for c in cand_ids)} tokens) and "
                                f"the blank's {self.cfg.blank_tokens} mask tokens do not fit in seq_length "
                                f"{self.seq_length}; raise data.objective.seq_length.")
            left: list[int] = []
            for j, piece in enumerate(pieces[:k]):
                left += ids[piece] if j % 2 == 0 else [other]
            right: list[int] = []
            for j, piece in enumerate(pieces[k + 1:]):
                right += ids[piece] if j % 2 == 0 else [other]
            before, after = window(left, right, room)
            contexts.append(before + [mask] * self.cfg.blank_tokens + after)
            choices.append(cand_ids)
            options.append(list(candidates))
            tags.append(tag)
            groups.append(number)
            if answers is not None:
                gold.append(self._answer(answers, tag, len(candidates), where[-1]))
        out = self.questions(contexts, [[] for _ in contexts], choices, gold if answers is not None else None,
                             tags, options, groups, where)
        log.info(f"{path}: {len(out):,} blanks on {len(lines):,} lines")
        return out

    def _answers(self, path: Path) -> dict[str, Any]:
        file = answer_path(path)
        if not file.is_file():
            raise UserError(f"{path}: its answers are read from {file} (a JSON object {{\"#idiom000001#\": index}} "
                            "beside the data file, named <name>_answer.json as in CLUE's ChID release), which "
                            "does not exist.")
        data = load_json(file, "a JSON object {\"#idiom000001#\": index}")
        if not isinstance(data, dict):
            raise UserError(f"{file}: expected a JSON object {{\"#idiom000001#\": index}}, found "
                            f"{type(data).__name__}.")
        self._answer_file = file
        return data

    def _answer(self, answers: dict[str, Any], tag: str, count: int, where: str) -> int:
        if tag not in answers:
            raise UserError(f"{where}: the blank has no answer in {self._answer_file}.")
        value = answers[tag]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < count:
            raise UserError(f"{self._answer_file}: the answer of {tag} ({where}) is {value!r}; expected the index "
                            f"of one of its {count} candidates, 0..{count - 1}.")
        return value

    # ---------------------------------------------------------------- prediction
    def choose(self, logits: torch.Tensor, instances: ChoiceQuestions) -> np.ndarray:
        """The most probable candidate of each blank; with ``task.exclusive``, the blanks of a line
        take different candidates, assigned greedily by probability (while candidates remain)."""
        chosen = logits.argmax(-1).numpy().copy()
        if not self.cfg.exclusive or not len(chosen):
            return chosen
        probs = torch.softmax(logits.float(), dim=-1).numpy()
        order = np.argsort(instances.groups, kind="stable")
        bounds = np.flatnonzero(np.diff(instances.groups[order])) + 1
        for members in np.split(order, bounds):
            if len(members) < 2:
                continue
            count = int(instances.counts[members].min())
            table = probs[members][:, :count].copy()
            for _ in range(min(len(members), count)):
                blank, candidate = np.unravel_index(int(np.argmax(table)), table.shape)
                chosen[members[blank]] = candidate
                table[blank, :] = -1.0
                table[:, candidate] = -1.0
        return chosen

    predictions_file = "predictions.json"

    def write_predictions(self, path: Path, logits: torch.Tensor, instances: ChoiceQuestions,
                          probabilities: bool) -> None:
        """A JSON object ``{tag: index}`` (values ``{"label", "probabilities"}`` on request)."""
        from pentad.files import atomic_write_text

        chosen = self.choose(logits, instances)
        if probabilities:
            probs = self.probabilities(logits, instances)
            out: dict[str, Any] = {tag: {"label": int(c), "probabilities": [round(p, 6) for p in probs[q]]}
                                   for q, (tag, c) in enumerate(zip(instances.ids, chosen))}
        else:
            out = {tag: int(c) for tag, c in zip(instances.ids, chosen)}
        atomic_write_text(path, json.dumps(out, ensure_ascii=False, indent=1) + "\n")
