"""pentad: pre-train and fine-tune models of every modality from one five-slot design.

A model is embedding -> encoder -> (target embedding -> decoder) -> target, each slot filled
from a typed config. See ``pentad.builder.build_model`` and the ``pentad`` command.
"""

__version__ = "0.1.0"
