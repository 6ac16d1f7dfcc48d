"""The run config: every section of one pentad run, assembled from the registries."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from pentad.config.base import StrictModel
from pentad.config.unions import registry_union
from pentad.registry import OBJECTIVES, TASKS, TOKENIZERS
from pentad.training.config import TrainConfig


class RunConfigBase(StrictModel):
    description: str | None = Field(None, description="free text, e.g. what a zoo recipe is")
    init: Path | None = Field(None, description="initialise weights from a run directory or checkpoint")
    output: Path | None = Field(None, description="run directory to write")
    train: TrainConfig = Field(default_factory=TrainConfig)


@cache
def run_config_class() -> Any:
    """``RunConfig`` with model, tokenizer, data (objective) and task unions from the registries."""
    import pentad.tasks  # noqa: F401  (registers tasks)
    from pentad.config.model import model_config_class

    return _run_config("RunConfig", model=(model_config_class(), ...), task=(registry_union(TASKS) | None, None))


@cache
def preprocess_config_class() -> Any:
    """The run config as ``pentad preprocess`` validates it: ``tokenizer``, ``data`` (objective) and
    ``train`` as in :func:`run_config_class`; ``model`` and ``task``, which preprocessing does not
    read, are kept as given (mappings, checked by the commands that read them). Their unions come
    from the component and task registries, whose modules import torch: seconds of start-up that
    preprocessing, which needs no torch, would otherwise pay."""
    return _run_config("PreprocessRunConfig", model=(dict[str, Any] | None, None), task=(dict[str, Any] | None, None))


def _run_config(name: str, model: tuple[Any, Any], task: tuple[Any, Any]) -> Any:
    import pentad.data.objectives  # noqa: F401  (registers objectives)
    import pentad.data.tokenizers  # noqa: F401  (registers tokenizers)
    from pentad.data.config import DataConfigBase

    data = create_model("DataConfig", __base__=DataConfigBase,
                        objective=(registry_union(OBJECTIVES) | None, None))
    return create_model(
        name, __base__=RunConfigBase,
        model=model,
        tokenizer=(registry_union(TOKENIZERS) | None, None),
        data=(data, Field(default_factory=data)),
        task=task,
    )
