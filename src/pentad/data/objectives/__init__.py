"""Pre-training objectives, registered in ``pentad.registry.OBJECTIVES`` when this package is imported.

Each objective owns how corpus lines become stored instances and how instances collate into a
Batch (see :mod:`pentad.data.objectives.base`).
"""

from pentad.data.objectives.base import MaskingObjectiveConfig, Objective, ObjectiveConfig
from pentad.data.objectives.bert import BertObjective, BertObjectiveConfig
from pentad.data.objectives.cls import ClsObjective, ClsObjectiveConfig
from pentad.data.objectives.lm import LmObjective, LmObjectiveConfig
from pentad.data.objectives.mlm import MlmObjective, MlmObjectiveConfig

__all__ = [
    "BertObjective", "BertObjectiveConfig", "ClsObjective", "ClsObjectiveConfig", "LmObjective",
    "LmObjectiveConfig", "MaskingObjectiveConfig", "MlmObjective", "MlmObjectiveConfig",
    "Objective", "ObjectiveConfig",
]
