"""Prefix language modelling (UniLM-style seq2seq in one stack): generate the target after a prefix.

Corpus: ``source<TAB>target`` per line (blank lines are ignored). An instance is
``[CLS] source [SEP] target [SEP]``, truncated to ``seq_length`` longest side first (both sides
keep at least one token). Segments are 0 on the prefix ``[CLS] source [SEP]``, 1 on
``target [SEP]`` and 0 at padding, which is how an encoder with ``mask: prefix`` finds the
prefix. ``labels.lm`` at position j is the token at j + 1 when that token belongs to the target
part (so the prefix's final ``[SEP]`` predicts the first target token and the last target token
predicts the closing ``[SEP]``), IGNORE_INDEX elsewhere. The labels are already shifted, so the
objective works with the ``lm`` target (TencentPretrain's prefixlm only ran with ``mlm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from pentad.data.corpus import BadLine
from pentad.data.objectives.base import (
    Objective,
    ObjectiveConfig,
    new_batch,
    segments_from_split,
    to_batch_tensor,
)
from pentad.data.shards import Instances
from pentad.data.tsv import fit_pair
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch

PAIR_FORMAT = ("one pair per line, 'source<TAB>target' (UTF-8 text, non-empty target); blank "
               "lines are ignored")


def parse_pair(text: str, require_source: bool) -> tuple[str, str] | None:
    """``(source, target)`` of a tab-separated line, None for a blank line; BadLine otherwise."""
    if not text.strip():
        return None
    fields = text.split("\t")
    if len(fields) != 2:
        raise BadLine(f"has {len(fields)} tab-separated field(s); expected 2 ('source<TAB>target')")
    source, target = fields
    if not target.strip() or (require_source and not source.strip()):
        raise BadLine(f"has an empty {'target' if not target.strip() else 'source'}")
    return source, target


class PrefixLmObjectiveConfig(ObjectiveConfig):
    type: Literal["prefixlm"] = "prefixlm"


@OBJECTIVES.register("prefixlm")
class PrefixLmObjective(Objective):
    """Pairs -> ``[CLS] source [SEP] target [SEP]`` with next-token labels on the target part."""

    Config = PrefixLmObjectiveConfig
    truncation_refused: ClassVar[str | None] = (
        "labels.lm scores only the target part after the source, which a shorter length can cut away "
        "entirely (leaving nothing to score)")
    provides: ClassVar[frozenset[str]] = frozenset({"tokens", "segments", "padding_mask", "labels.lm"})
    corpus_format: ClassVar[str] = PAIR_FORMAT
    field_names: ClassVar[tuple[str, ...]] = ("split",)

    def __init__(self, cfg: PrefixLmObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)
        self.require_ids(**{"[CLS]": tokenizer.cls_id, "[SEP]": tokenizer.sep_id})
        self.cls_id, self.sep_id = int(tokenizer.cls_id), int(tokenizer.sep_id)

    def parse_line(self, text: str, context: Any) -> tuple[str, str] | None:
        return parse_pair(text, require_source=False)

    def build(self, items: list[tuple[str, str] | None], rng: np.random.Generator) -> Instances:
        pairs = [item for item in items if item is not None]
        sources = self.tokenizer.encode_batch([s for s, _ in pairs])
        targets = self.tokenizer.encode_batch([t for _, t in pairs])
        sequences, splits = [], []
        for source, target in zip(sources, targets):
            keep_source, keep_target = fit_pair(len(source), len(target), self.seq_length - 3)
            sequences.append(np.concatenate([[self.cls_id], source[:keep_source], [self.sep_id],
                                             target[:keep_target], [self.sep_id]]).astype(np.int64))
            splits.append(keep_source + 2)
        return Instances.from_sequences(sequences, split=splits)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S]; labels.lm [B,S] (next token where it is a target token)."""
        from pentad.components.base import IGNORE_INDEX  # on first use; see objectives.base

        ids, valid = instances.padded(self.pad_id)
        segments = segments_from_split(instances.fields["split"], valid)
        labels = np.full_like(ids, IGNORE_INDEX)
        # Position j is scored when token j+1 exists and lies in segment 1 (the target part).
        labels[:, :-1] = np.where(segments[:, 1:] == 1, ids[:, 1:], IGNORE_INDEX)
        return new_batch(tokens=to_batch_tensor(ids), segments=to_batch_tensor(segments),
                         padding_mask=to_batch_tensor(~valid), labels={"lm": to_batch_tensor(labels)})
