"""The run config: every section of one pentad run, assembled from the registries."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from pentad.config.base import StrictModel
from pentad.config.model import model_config_class
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
    import pentad.data.objectives  # noqa: F401  (registers objectives)
    import pentad.data.tokenizers  # noqa: F401  (registers tokenizers)
    import pentad.tasks  # noqa: F401  (registers tasks)
    from pentad.data.config import DataConfigBase

    data = create_model("DataConfig", __base__=DataConfigBase,
                        objective=(registry_union(OBJECTIVES) | None, None))
    return create_model(
        "RunConfig", __base__=RunConfigBase,
        model=(model_config_class(), ...),
        tokenizer=(registry_union(TOKENIZERS) | None, None),
        data=(data, Field(default_factory=data)),
        task=(registry_union(TASKS) | None, None),
    )


