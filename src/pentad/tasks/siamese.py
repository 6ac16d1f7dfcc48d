"""Siamese sentence-pair classification: the ``classification`` task with ``pair_input: separate``.

TencentPretrain users reach for ``run_classifier_siamese.py``: text_a and text_b go through the two
(usually tied) streams of a two-stream model and a softmax head reads (u, v, |u-v|, u*v) of the two pooled
vectors. pentad's classification task already does exactly that with ``pair_input: separate``; this
task is that task under the name those users look for, with TencentPretrain's feature set by default.
Everything else (reading, label maps, batches, metrics, predictions) is the classification task's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pentad.components.targets.pair_cls import PairFeature
from pentad.registry import TASKS
from pentad.tasks.classification import ClassificationTask, ClassificationTaskConfig


class SiameseTaskConfig(ClassificationTaskConfig):
    type: Literal["siamese"] = "siamese"  # type: ignore[assignment]
    pair_input: Literal["separate"] = Field(  # type: ignore[assignment]
        "separate", description="always separate: text_a and text_b go to the two streams of a two-stream model")
    pair_features: list[PairFeature] = Field(["u", "v", "abs_diff", "product"], min_length=1,
                                             description="the pair_cls head's features (TencentPretrain's "
                                             "siamese classifier: u, v, abs_diff, product)")


@TASKS.register("siamese")
class SiameseTask(ClassificationTask):
    """Siamese sentence-pair classification: text_a and text_b through the two streams of a two-stream model."""

    Config = SiameseTaskConfig
    input_format = "label<TAB>text_a<TAB>text_b"
