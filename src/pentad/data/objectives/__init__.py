"""Pre-training objectives, registered in ``pentad.registry.OBJECTIVES`` when this package is imported.

Each objective owns how corpus lines become stored instances and how instances collate into a
Batch (see :mod:`pentad.data.objectives.base`).
"""

from pentad.data.objectives.albert import AlbertObjective, AlbertObjectiveConfig
from pentad.data.objectives.bart import BartObjective, BartObjectiveConfig
from pentad.data.objectives.base import MaskingObjectiveConfig, Objective, ObjectiveConfig
from pentad.data.objectives.beit import BeitObjective, BeitObjectiveConfig
from pentad.data.objectives.bert import BertObjective, BertObjectiveConfig
from pentad.data.objectives.bilm import BilmObjective, BilmObjectiveConfig
from pentad.data.objectives.cls import ClsObjective, ClsObjectiveConfig
from pentad.data.objectives.cls_mlm import ClsMlmObjective, ClsMlmObjectiveConfig
from pentad.data.objectives.dalle import DalleObjective, DalleObjectiveConfig
from pentad.data.objectives.gsg import GsgObjective, GsgObjectiveConfig
from pentad.data.objectives.llm import (
    LlmPretrainObjective,
    LlmPretrainObjectiveConfig,
    LlmSftObjective,
    LlmSftObjectiveConfig,
)
from pentad.data.objectives.lm import LmObjective, LmObjectiveConfig
from pentad.data.objectives.mlm import MlmObjective, MlmObjectiveConfig
from pentad.data.objectives.mt import MtObjective, MtObjectiveConfig, Seq2SeqObjective, Seq2SeqObjectiveConfig
from pentad.data.objectives.prefixlm import PrefixLmObjective, PrefixLmObjectiveConfig
from pentad.data.objectives.s2t import S2tObjective, S2tObjectiveConfig
from pentad.data.objectives.t5 import T5Objective, T5ObjectiveConfig
from pentad.data.objectives.vision import (
    ClipObjective,
    ClipObjectiveConfig,
    ViltObjective,
    ViltObjectiveConfig,
    VitObjective,
    VitObjectiveConfig,
)

__all__ = [
    "AlbertObjective", "AlbertObjectiveConfig", "ClipObjective", "ClipObjectiveConfig", "BartObjective",
    "BartObjectiveConfig",
    "BeitObjective", "BeitObjectiveConfig",
    "BertObjective", "BertObjectiveConfig", "BilmObjective", "BilmObjectiveConfig", "ClsMlmObjective",
    "ClsMlmObjectiveConfig", "ClsObjective", "ClsObjectiveConfig", "DalleObjective", "DalleObjectiveConfig",
    "GsgObjective", "GsgObjectiveConfig",
    "LlmPretrainObjective", "LlmPretrainObjectiveConfig", "LlmSftObjective", "LlmSftObjectiveConfig",
    "LmObjective", "LmObjectiveConfig", "MaskingObjectiveConfig", "MlmObjective", "MlmObjectiveConfig",
    "MtObjective", "MtObjectiveConfig", "Objective", "ObjectiveConfig", "PrefixLmObjective",
    "PrefixLmObjectiveConfig", "S2tObjective", "S2tObjectiveConfig", "Seq2SeqObjective",
    "Seq2SeqObjectiveConfig", "T5Objective",
    "T5ObjectiveConfig", "ViltObjective", "ViltObjectiveConfig", "VitObjective", "VitObjectiveConfig",
]
