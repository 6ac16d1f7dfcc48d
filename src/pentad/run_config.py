"""The run config: every section of one pentad run, assembled from the registries, and its validation.

The model, tokenizer and objective unions come from the component, tokenizer and objective registries,
filled here by importing those packages (they stand below this floor). The task union comes from the
tasks registered when the class is made: tasks stand above this floor (they train and generate), so
they are registered by whoever imports them — the task runner, or the top floor's
:func:`pentad.assembly.fill_registries`, which the command line calls first. Reading a saved run
therefore imports no task module. Where no task is registered (a library caller below the task floor:
generation from a fine-tuned run), a task section is kept as the mapping it is, unchecked, as
``pentad preprocess`` keeps the model section: nothing below the task floor reads it, and whatever
does (the runner, distillation, pruning) stands where the tasks are registered and validates it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, create_model

import pentad.data.objectives  # noqa: F401  (registers objectives)
import pentad.data.tokenizers  # noqa: F401  (registers tokenizers)
from pentad.config.base import StrictModel
from pentad.config.loader import problems_from_validation
from pentad.config.unions import registry_union
from pentad.data.config import DataConfigBase
from pentad.errors import ConfigError
from pentad.registry import OBJECTIVES, TASKS, TOKENIZERS
from pentad.training.config import TrainConfig

if TYPE_CHECKING:
    from pentad.config.base import SlotConfig
    from pentad.config.model import ModelConfigBase
    from pentad.data.objectives.base import ObjectiveConfig
    from pentad.tasks.base import TaskConfig

    class DataConfig(DataConfigBase):
        """The data section as :func:`run_config_class` builds it: with the objective."""

        objective: ObjectiveConfig | None


class RunConfigBase(StrictModel):
    description: str | None = Field(None, description="free text, e.g. what a zoo recipe is")
    imported_from: Literal["tencentpretrain"] | None = Field(
        None, description="the toolkit whose config file this run's config was imported from (set by the import; "
        "fine-tuning then takes that toolkit's defaults, task.defaults=auto)")
    init: Path | None = Field(None, description="initialise weights from a run directory or checkpoint, or "
                                                "hf:NAME[@REV], a Hugging Face Hub model converted once")
    output: Path | None = Field(None, description="run directory to write")
    train: TrainConfig = Field(default_factory=TrainConfig)
    if TYPE_CHECKING:  # added by run_config_class() from the registries; statically, their bases
        model: ModelConfigBase
        tokenizer: SlotConfig | None
        data: DataConfig
        task: TaskConfig | None


def run_config_class() -> Any:
    """``RunConfig`` with model, tokenizer, data (objective) and task unions from the registries (the
    task union from the tasks registered now)."""
    return _run_config_class(tuple(TASKS.names()))


@cache
def _run_config_class(tasks: tuple[str, ...]) -> Any:
    from pentad.components.model_config import model_config_class  # (torch: not for preprocess_config_class)

    task = registry_union(TASKS) | None if tasks else dict[str, Any] | None
    return _run_config("RunConfig", model=(model_config_class(), ...), task=(task, None))


@cache
def preprocess_config_class() -> Any:
    """The run config as ``pentad preprocess`` validates it: ``tokenizer``, ``data`` (objective) and
    ``train`` as in :func:`run_config_class`; ``model`` and ``task``, which preprocessing does not
    read, are kept as given (mappings, checked by the commands that read them). Their unions come
    from the component and task registries, whose modules import torch: seconds of start-up that
    preprocessing, which needs no torch, would otherwise pay."""
    return _run_config("PreprocessRunConfig", model=(dict[str, Any] | None, None), task=(dict[str, Any] | None, None))


def _run_config(name: str, model: tuple[Any, Any], task: tuple[Any, Any]) -> Any:
    data = create_model("DataConfig", __base__=DataConfigBase,
                        objective=(registry_union(OBJECTIVES) | None, None))
    return create_model(
        name, __base__=RunConfigBase,
        model=model,
        tokenizer=(registry_union(TOKENIZERS) | None, None),
        data=(data, Field(default_factory=data)),
        task=task,
    )


def validate_raw(raw: dict[str, Any], applied: dict[str, str], label: str, preprocess_only: bool = False) -> Any:
    """``raw`` as a ``RunConfig``; with ``preprocess_only``, as ``pentad preprocess`` reads it (model and task
    sections unchecked: :func:`preprocess_config_class`). ``applied`` maps the dotted keys of the overrides
    to their text, so that a problem names the override it comes from, else ``label`` (the file)."""
    cls = preprocess_config_class() if preprocess_only else run_config_class()

    def source_of(path: str) -> str:
        for key, text in applied.items():
            if path == key or path.startswith(key + ".") or key.startswith(path + "."):
                return f"override {text}"
        return label

    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(problems_from_validation(e, raw, cls, source_of), f"invalid config {label}") from None
