"""Prompt-based (cloze) classification over the MLM head: PET, TencentPretrain's ``run_classifier_prompt``.

Each text is put into a template with one answer slot, e.g. ``[TEXT_A]这个很[MASK]。``; the
pre-trained MLM head scores the slot, and a class's score is its verbalizer word's logit there
(``task.verbalizer: {好: 1, ...}`` is written ``{label: word}``: ``{"1": 好, "0": 差}``). The loss is the
cross-entropy over the verbalizer words' logits, so the model keeps its pre-trained head (its
weights are loaded from ``init``, not replaced as pre-training heads are) and works before any
training: ``task.zero_shot: true`` evaluates the initial model on dev/test without training and
keeps it as the run's model (``pentad infer`` then predicts with it); otherwise fine-tuning trains
the whole model through the head (few-shot with a small training file).

Template: ``[TEXT_A]``, optional ``[TEXT_B]``, exactly one answer slot ``[MASK]`` (or ``[ANS]``, as
TencentPretrain writes it) and any literal text. TencentPretrain's ``models/prompts.json`` works
unchanged: ``task.prompts_file`` and ``task.prompt_id`` take the template and ``answer_words``
from it. Every verbalizer word must be one token of the vocabulary (a Chinese character with
BERT's Chinese vocabulary). The model input is ``[CLS] filled template [SEP]``, one segment; the
texts are truncated to fit ``seq_length`` with the template's own tokens kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from pentad.errors import UserError
from pentad.registry import TASKS
from pentad.tasks.base import TaskConfig
from pentad.tasks.classification import ClassificationTask

SLOTS = ("[TEXT_A]", "[TEXT_B]", "[MASK]", "[ANS]")


class PromptTaskConfig(TaskConfig):
    type: Literal["prompt"] = "prompt"
    template: str | None = Field(None, description="the cloze template: [TEXT_A], optional [TEXT_B], one "
                                 "[MASK] (or [ANS]) and literal text, e.g. '[TEXT_A]这个很[MASK]。'")
    verbalizer: dict[str, str] | None = Field(None, description="{label: word}: the word (one token) whose MLM "
                                              "logit at the mask scores each label, e.g. {'1': 好, '0': 差}")
    prompts_file: Path | None = Field(None, description="a TencentPretrain prompts.json ({id: {template, "
                                      "answer_words}}) to take template and verbalizer from, with prompt_id")
    prompt_id: str | None = Field(None, description="the entry of prompts_file")
    zero_shot: bool = Field(False, description="do not train: evaluate the initial (pre-trained) model on "
                            "dev/test and keep it as the run's model")
    metric: Literal["accuracy", "macro_f1"] = Field("accuracy", description="dev metric that picks the best model")


def resolve_prompt(cfg: PromptTaskConfig) -> tuple[str, dict[str, str]]:
    """(template, verbalizer) from the config, or from ``prompts_file`` at ``prompt_id``."""
    if cfg.prompts_file is not None or cfg.prompt_id is not None:
        if cfg.prompts_file is None or cfg.prompt_id is None:
            raise UserError("task.prompts_file and task.prompt_id go together (the file of prompts and the "
                            "entry to use); give both, or task.template and task.verbalizer instead")
        if cfg.template is not None or cfg.verbalizer is not None:
            raise UserError("give either task.prompts_file/task.prompt_id or task.template/task.verbalizer, "
                            "not both")
        try:
            prompts = json.loads(Path(cfg.prompts_file).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{cfg.prompts_file}: cannot read the prompts file ({e}); expected JSON "
                            "{id: {template, answer_words}} as TencentPretrain's models/prompts.json") from None
        entry = prompts.get(cfg.prompt_id) if isinstance(prompts, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("template"), str) \
                or not isinstance(entry.get("answer_words"), dict):
            known = sorted(prompts) if isinstance(prompts, dict) else []
            raise UserError(f"{cfg.prompts_file}: no entry {cfg.prompt_id!r} with a 'template' string and an "
                            f"'answer_words' object (entries: {known})")
        return entry["template"], {str(k): str(v) for k, v in entry["answer_words"].items()}
    if cfg.template is None or cfg.verbalizer is None:
        raise UserError("the prompt task needs task.template (e.g. '[TEXT_A]这个很[MASK]。') and task.verbalizer "
                        "({label: word}, e.g. {'1': 好, '0': 差}), or task.prompts_file and task.prompt_id")
    return cfg.template, dict(cfg.verbalizer)


def parse_template(template: str) -> list[str]:
    """The template's parts: slots (``[TEXT_A]``, ``[TEXT_B]``, ``[MASK]``; ``[ANS]`` read as ``[MASK]``)
    and literal texts, in order; UserError unless it has one [TEXT_A], at most one [TEXT_B] and exactly
    one answer slot."""
    parts = [p for p in re.split(r"(\[TEXT_A\]|\[TEXT_B\]|\[MASK\]|\[ANS\])", template) if p]
    parts = ["[MASK]" if p == "[ANS]" else p for p in parts]
    counts = {slot: parts.count(slot) for slot in ("[TEXT_A]", "[TEXT_B]", "[MASK]")}
    problems = []
    if counts["[TEXT_A]"] != 1:
        problems.append(f"[TEXT_A] {counts['[TEXT_A]']} times (expected once)")
    if counts["[TEXT_B]"] > 1:
        problems.append(f"[TEXT_B] {counts['[TEXT_B]']} times (expected at most once)")
    if counts["[MASK]"] != 1:
        problems.append(f"{counts['[MASK]']} answer slots [MASK]/[ANS] (expected exactly one)")
    if problems:
        raise UserError(f"task.template {template!r} has " + "; ".join(problems)
                        + ". A template is e.g. '[TEXT_A]这个很[MASK]。' (pairs: '[TEXT_A]？[MASK]，[TEXT_B]')")
    return parts


def verbalizer_ids(verbalizer: dict[str, str], tokenizer: Any) -> dict[str, int]:
    """{label: token id} of the verbalizer words; UserError for a word that is not exactly one known token,
    or a word used by two labels."""
    if len(verbalizer) < 2:
        raise UserError(f"task.verbalizer {verbalizer} has {len(verbalizer)} label(s); give a word for each of at "
                        "least two labels, {label: word}")
    ids: dict[str, int] = {}
    for label, word in verbalizer.items():
        pieces = tokenizer.encode(word)
        if len(pieces) != 1 or (tokenizer.unk_id is not None and pieces[0] == tokenizer.unk_id):
            shown = [tokenizer.id_to_token(i) for i in pieces]
            what = "not in the vocabulary" if len(pieces) == 1 else f"{len(pieces)} tokens {shown}"
            raise UserError(f"task.verbalizer: the word {word!r} of label {label!r} is {what}; each verbalizer "
                            "word must be a single token of the vocabulary (with a Chinese BERT vocabulary: "
                            "one character)")
        ids[label] = pieces[0]
    seen: dict[int, str] = {}
    for label, i in ids.items():
        if i in seen:
            raise UserError(f"task.verbalizer: labels {seen[i]!r} and {label!r} have the same word "
                            f"{verbalizer[label]!r}; each label needs its own word")
        seen[i] = label
    return ids


@TASKS.register("prompt")
class PromptTask(ClassificationTask):
    """Prompt-based classification: a cloze template and a verbalizer over the MLM head (zero- and few-shot)."""

    Config = PromptTaskConfig
    input_format = "label<TAB>text_a[<TAB>text_b], labels: the verbalizer's"
    metric_names = ("accuracy", "macro_f1")
    head = "mlm"

    def __init__(self, cfg: PromptTaskConfig, tokenizer, seq_length: int, state=None):
        from pentad.data.tsv import LabelMap

        template, verbalizer = resolve_prompt(cfg)
        self.parts = parse_template(template)
        if tokenizer.mask_id is None or tokenizer.cls_id is None or tokenizer.sep_id is None:
            from pentad.data.masking import describe_tokenizer

            raise UserError(f"the prompt task needs [CLS], [SEP] and [MASK] tokens, which the "
                            f"{describe_tokenizer(tokenizer)} lacks")
        ids = verbalizer_ids(verbalizer, tokenizer)
        labels = list(ids)
        if all(re.fullmatch(r"\d+", k) for k in labels) and sorted(int(k) for k in labels) == list(range(len(labels))):
            labels = sorted(labels, key=int)
            self._label_map = LabelMap(labels, integer=True)
        else:
            self._label_map = LabelMap(labels, integer=False)
        self.word_ids = [ids[k] for k in labels]
        self.literals = {p: tokenizer.encode(p) for p in self.parts if p not in SLOTS}
        self.mlm_options: dict[str, Any] = {}
        super().__init__(cfg, tokenizer, seq_length, state)
        self.label_map = self._label_map  # the verbalizer's labels, whatever a saved state says

    # the classification task's pair_input: a prompt's texts always share one sequence
    separate = False

    @property
    def trains(self) -> bool:  # type: ignore[override]
        return not self.cfg.zero_shot

    @classmethod
    def sources(cls, cfg: PromptTaskConfig, data: Any) -> dict[str, Any]:
        if not cfg.zero_shot:
            return super().sources(cfg, data)
        if data.dev is None and data.test is None:
            raise UserError("task.zero_shot evaluates the initial model on data.dev and/or data.test; give one")
        return {"train": None, "dev": data.dev, "test": data.test}

    def bind(self, run_cfg: Any) -> None:
        """The head takes the name and options of the model's MLM head, whose pre-trained weights it keeps."""
        for target in run_cfg.model.targets:
            if getattr(target, "type", None) in ("mlm", "prompt"):
                self.head = target.target_name
                self.mlm_options = {k: getattr(target, k) for k in ("activation", "norm", "layer_norm_eps")}
                return
        raise UserError("the prompt task reads the MLM head of a masked language model, but the model config has "
                        f"no mlm target (targets: {[t.type for t in run_cfg.model.targets]}); use a BERT-style "
                        "config or init from a run pre-trained with mlm")

    def fit(self, train_path: Path | None) -> None:
        """The labels are the verbalizer's; a training label it lacks is an error naming its line."""
        if train_path is not None:
            from pentad.data.tsv import read_classification_tsv

            rows, _ = read_classification_tsv(train_path, with_labels=True)
            for row in rows:
                self.label_map.encode(row.label or "", train_path, row.line)

    def load_state(self, state: dict[str, Any]) -> None:
        return None  # the verbalizer (in the run's config) defines the labels

    def describe(self) -> str:
        words = ", ".join(f"{n}={self.tokenizer.id_to_token(i)}" for n, i in zip(self.label_map.names, self.word_ids))
        return f"template {''.join(self.parts)!r}, {self.num_labels} labels ({words})"

    def head_configs(self) -> list[dict[str, Any]]:
        return [{"type": "prompt", "name": self.head, "mask_id": int(self.tokenizer.mask_id),
                 "word_ids": list(self.word_ids), **self.mlm_options}]

    def head_names(self) -> tuple[str, ...]:
        return ()  # the MLM head is not new: its pre-trained weights are loaded

    @property
    def provides(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"tokens", "segments", "padding_mask", f"labels.{self.head}"})

    # ---------------------------------------------------------------- data
    def encode_rows(self, rows, path: Path, with_labels: bool):
        """The instances of rows read from ``path`` (:meth:`read` and :meth:`read_windows` read them)."""
        from pentad.data.shards import Instances
        from pentad.data.tsv import fit_pair

        pairs = "[TEXT_B]" in self.parts
        if rows and pairs and rows[0].text_b is None:
            raise UserError(f"{path}: the template has [TEXT_B], but the file has no text_b column")
        fixed = sum(len(ids) for ids in self.literals.values()) + 1  # literal tokens and the mask
        budget = self.seq_length - 2 - fixed
        if budget < 1:
            raise UserError(f"task.template takes {fixed} tokens, leaving no room for the text in seq_length "
                            f"{self.seq_length} ([CLS] and [SEP] included); shorten the template or raise "
                            "data.objective.seq_length")
        first = self.tokenizer.encode_batch([r.text_a for r in rows])
        second = self.tokenizer.encode_batch([r.text_b or "" for r in rows]) if pairs else [[] for _ in rows]
        cls_id, sep_id, mask_id = int(self.tokenizer.cls_id), int(self.tokenizer.sep_id), int(self.tokenizer.mask_id)
        sequences = []
        for row, a, b in zip(rows, first, second):
            len_a, len_b = fit_pair(len(a), len(b), budget) if pairs else (min(len(a), budget), 0)
            ids = [cls_id]
            for part in self.parts:
                ids += a[:len_a] if part == "[TEXT_A]" else b[:len_b] if part == "[TEXT_B]" else \
                    [mask_id] if part == "[MASK]" else self.literals[part]
            ids.append(sep_id)
            if ids.count(mask_id) != 1:
                raise UserError(f"{path}, line {row.line}: the text contains the mask token itself; the template's "
                                "[MASK] must be the only one")
            sequences.append(np.asarray(ids, dtype=np.int64))
        fields: dict[str, Any] = {"split": [len(s) for s in sequences]}  # one segment
        if with_labels and rows and all(r.label is not None for r in rows):
            fields["label"] = [self.label_map.encode(r.label or "", path, r.line) for r in rows]
        return Instances.from_sequences(sequences, **fields)

    def collate(self, instances, indices, rng: np.random.Generator):
        batch = self.objective.collate(instances[np.asarray(indices)], rng)
        label = batch.labels.pop("cls", None)
        if label is not None:
            batch.labels[self.head] = label
        return batch
