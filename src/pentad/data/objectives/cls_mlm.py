"""Classification plus masked LM on the same labelled text (TencentPretrain's ``cls_mlm``).

Corpus: the ``cls`` format (a TSV header ``label<TAB>text_a[<TAB>text_b]``, then one example per
line). Instances are built exactly as for ``cls``; at collate time the tokens are also masked
dynamically (same options as ``mlm``: ``mask_prob``, whole-word and span masking), so a batch
carries both ``labels.cls`` [B] and ``labels.mlm`` [B,S].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from pentad.data.masking import MASKING_COLLATE_OPTIONS, Masker, MaskingOptions
from pentad.data.objectives.base import (
    MaskingObjectiveConfig,
    new_batch,
    segments_from_split,
    to_batch_tensor,
)
from pentad.data.objectives.cls import ClsObjective
from pentad.data.shards import Instances
from pentad.registry import OBJECTIVES

if TYPE_CHECKING:
    from pentad.components.base import Batch


class ClsMlmObjectiveConfig(MaskingObjectiveConfig, MaskingOptions):
    type: Literal["cls_mlm"] = "cls_mlm"


@OBJECTIVES.register("cls_mlm")
class ClsMlmObjective(ClsObjective):
    """Labelled text (pairs) -> tokens (masked), segments, padding_mask, labels.cls, labels.mlm."""

    Config = ClsMlmObjectiveConfig
    provides: ClassVar[frozenset[str]] = frozenset(
        {"tokens", "segments", "padding_mask", "labels.cls", "labels.mlm"})
    collate_options: ClassVar[frozenset[str]] = MASKING_COLLATE_OPTIONS

    def __init__(self, cfg: ClsMlmObjectiveConfig, tokenizer: Any):
        super().__init__(cfg, tokenizer)  # type: ignore[arg-type]
        self.masker = Masker.from_config(tokenizer, cfg)

    def collate(self, instances: Instances, rng: np.random.Generator) -> Batch:
        """tokens/segments/padding_mask [B,S]; labels.mlm [B,S]; labels.cls [B] when labelled."""
        ids, valid = instances.padded(self.pad_id)
        inputs, mlm = self.masker(ids, valid, rng)
        labels = {"mlm": to_batch_tensor(mlm)}
        if "label" in instances.fields:
            labels["cls"] = to_batch_tensor(instances.fields["label"].astype(np.int64))
        return new_batch(tokens=to_batch_tensor(inputs),
                         segments=to_batch_tensor(segments_from_split(instances.fields["split"], valid)),
                         padding_mask=to_batch_tensor(~valid), labels=labels)
