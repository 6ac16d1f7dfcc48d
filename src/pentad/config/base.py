"""Base class of every typed config: strict (unknown keys are errors), validated on assignment, finite
numbers only (``.inf``/``nan`` in a float setting is an error, not a crash deep inside a run)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that forbids unknown keys; the base of every pentad config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)


class SlotConfig(Protocol):
    """Statically, the config of a registered component (an embedding part, encoder, decoder, target,
    tokenizer, objective): the name it is registered under. Its class comes from a registry union built at
    run time, so a static annotation can promise only this; its own fields are its class's."""

    @property
    def type(self) -> str: ...
