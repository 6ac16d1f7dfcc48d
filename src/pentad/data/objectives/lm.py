"""Causal language modelling: predict every next token of packed documents.

Each document (one per line, or one JSON object ``{"text": ...}`` per line) is tokenized,
preceded by the tokenizer's BOS when it has one distinct from the end-of-document token, and
followed by the end-of-document token (EOS, else SEP). With ``pack`` (the
default) documents are concatenated and cut into windows of ``seq_length + 1`` tokens that overlap
by one token, so every token of the corpus is predicted exactly once; without it each document is
windowed on its own. ``collate`` returns inputs ``x[:-1]`` and labels ``x[1:]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from pentad.data.corpus import BadLine
from pentad.data.objectives.base import Objective, ObjectiveConfig, new_batch, to_batch_tensor, windows
from pentad.data.shards import Instances
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

JSONL_SUFFIXES = (".jsonl", ".json")


class LmObjectiveConfig(ObjectiveConfig):
    type: Literal["lm"] = "lm"
    pack: bool = Field(True, description="Pack documents into full windows across document "
                                         "boundaries.")
    format: Literal["auto", "text", "jsonl"] = Field(
        "auto", description="Corpus format: one document per line ('text'), one JSON object with "
                            "a 'text' field per line ('jsonl'), or 'auto' (jsonl when the file "
                            "ends in .jsonl/.json or its first line is such an object).")


@OBJECTIVES.register("lm")
class LmObjective(Objective):
    """Documents -> next-token windows; provides tokens, padding_mask, labels.lm."""

    Config = LmObjectiveConfig
    truncation_refused: ClassVar[str | None] = None  # labels.lm: one next token per position
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "padding_mask", "labels.lm"})
    corpus_format: ClassVar[str] = ('one document per line (UTF-8 text), or JSON lines '
                                    '{"text": "..."}')
    collate_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: LmObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.cfg: LmObjectiveConfig = cfg
        eod = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
        self.require_ids(**{"an end-of-document token (EOS or [SEP])": eod})
        self.eod_id = int(eod)
        # A distinct start token (BERT's [CLS], SentencePiece's <s>) opens each document, as in
        # TencentPretrain ("[CLS] doc [SEP]") and LLaMA; GPT-2's single <|endoftext|> does not.
        bos = tokenizer.bos_id
        self.bos_ids = [int(bos)] if bos is not None and int(bos) != self.eod_id else []

    def instance_options(self) -> dict[str, Any]:
        options = super().instance_options()
        options.pop("format", None)  # how the corpus was read does not change the instances
        return options

    def begin_corpus(self, first_line: str, path: Path) -> tuple[Any, bool]:
        """Decide the format: the configured one, or for 'auto' jsonl by suffix or first line."""
        fmt = self.cfg.format
        if fmt == "auto":
            fmt = "jsonl" if Path(path).suffix.lower() in JSONL_SUFFIXES or _is_json_document(
                first_line) else "text"
        return fmt, False

    def parse_line(self, text: str, context: Any) -> str:
        if context != "jsonl" or not text.strip():
            return text
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise BadLine(f"is not valid JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise BadLine('is not a JSON object with a string "text" field')
        return record["text"]

    @property
    def packs(self) -> bool:
        return self.cfg.pack

    @property
    def window(self) -> tuple[int, int]:
        # seq_length inputs plus the one extra token the last input predicts; consecutive windows
        # share that token so no prediction is lost at a window boundary.
        return self.seq_length + 1, self.seq_length

    def build(self, items: list[str], rng: np.random.Generator) -> Instances | np.ndarray:
        documents = [np.asarray(self.bos_ids + list(ids) + [self.eod_id], dtype=np.int64)
                     for ids in self.tokenizer.encode_batch(items) if len(ids)]
        if self.cfg.pack:
            return np.concatenate(documents) if documents else np.zeros(0, np.int64)
        window, stride = self.window
        return Instances.concat([windows(d, window, stride, final=True)[0] for d in documents])

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/padding_mask [B,S] (S = longest window - 1); labels.lm [B,S] = next tokens."""
        ids, valid = instances.padded(self.pad_id)
        inputs = ids[:, :-1].copy()
        scored = valid[:, 1:]  # input j is real and scored exactly when token j+1 exists
        inputs[~scored] = self.pad_id
        # Imported here, not at module level: preprocess workers import this module without torch.
        from pentad.components.base import IGNORE_INDEX

        labels = np.where(scored, ids[:, 1:], IGNORE_INDEX)
        return new_batch(tokens=to_batch_tensor(inputs), padding_mask=to_batch_tensor(~scored),
                         labels={"lm": to_batch_tensor(labels.astype(np.int64))})


def _is_json_document(line: str) -> bool:
    """Whether ``line`` is a JSON object with a string "text" field."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("text"), str)
