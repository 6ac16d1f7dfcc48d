"""Base class of every typed config: strict (unknown keys are errors), validated on assignment, finite
numbers only (``.inf``/``nan`` in a float setting is an error, not a crash deep inside a run).

A config can be **frozen** (:func:`freeze`): a run resolves its config once into a complete plan and
freezes it, so that nothing that runs afterwards changes what the run is; setting a field of a frozen
config (at any depth), or changing one of its lists or mappings, raises :class:`FrozenConfigError`.
A deep copy (``model_copy(deep=True)``) is a new, unfrozen config its maker owns; a shallow copy is
unfrozen at its top only (the sections it shares stay frozen)."""

from __future__ import annotations

import copy
from typing import Any, NoReturn, Protocol

from pydantic import BaseModel, ConfigDict, PrivateAttr


class FrozenConfigError(TypeError):
    """A change to a frozen (resolved) run config: a programming error, not a user's."""


def _refuse(what: str) -> NoReturn:
    raise FrozenConfigError(f"{what}: the run config is resolved and frozen before the run starts (pentad.config."
                            "base.freeze); derive a new config (model_copy(update=...) or model_copy(deep=True)) "
                            "instead of changing this one")


class FrozenList(list):
    """A list field of a frozen config: reads like a list, refuses every change; copies and pickles as a
    plain list."""

    def _changed(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("a list of the run config was changed")

    append = extend = insert = pop = remove = clear = sort = reverse = _changed
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _changed

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(item, memo) for item in self]

    def __copy__(self) -> list[Any]:
        return list(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


class FrozenDict(dict):
    """A mapping field of a frozen config: reads like a dict, refuses every change; copies and pickles as a
    plain dict."""

    def _changed(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("a mapping of the run config was changed")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _changed

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return {copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()}

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)


class StrictModel(BaseModel):
    """A pydantic model that forbids unknown keys; the base of every pentad config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)
    _frozen: bool = PrivateAttr(False)

    @property
    def frozen(self) -> bool:
        """Whether this config is part of a resolved run (:func:`freeze`)."""
        private = self.__pydantic_private__
        return bool(private and private.get("_frozen"))

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and self.frozen:
            _refuse(f"{type(self).__name__}.{name} was set")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if self.frozen:
            _refuse(f"{type(self).__name__}.{name} was deleted")
        super().__delattr__(name)

    def __eq__(self, other: object) -> bool:
        # what the fields hold, not whether one side is frozen (pydantic's own compares private state too)
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__ and \
            self.__pydantic_extra__ == other.__pydantic_extra__

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any:
        made = super().model_copy(update=update, deep=deep)
        if deep:
            _set_frozen(made, False)
        else:
            made._frozen = False
        return made


def _set_frozen(node: Any, frozen: bool) -> Any:
    """``node`` with every config below it frozen or thawed in place; frozen, lists and mappings become
    :class:`FrozenList` / :class:`FrozenDict`; thawed, back to plain ones."""
    if isinstance(node, BaseModel):
        for name in type(node).model_fields:
            value = node.__dict__.get(name)
            new = _set_frozen(value, frozen)
            if new is not value:
                node.__dict__[name] = new  # (around __setattr__: the value is the same, only its container kind)
        if isinstance(node, StrictModel):
            node._frozen = frozen
        return node
    if isinstance(node, list):
        items = [_set_frozen(item, frozen) for item in node]
        return FrozenList(items) if frozen else list(items)
    if isinstance(node, tuple):
        return tuple(_set_frozen(item, frozen) for item in node)
    if isinstance(node, dict):
        items = {key: _set_frozen(value, frozen) for key, value in node.items()}
        return FrozenDict(items) if frozen else dict(items)
    return node


def freeze(cfg: Any) -> Any:
    """A frozen deep copy of ``cfg``: what a resolved run reads and nothing changes (module docstring)."""
    return _set_frozen(cfg.model_copy(deep=True), True)


class SlotConfig(Protocol):
    """Statically, the config of a registered component (an embedding part, encoder, decoder, target,
    tokenizer, objective): the name it is registered under. Its class comes from a registry union built at
    run time, so a static annotation can promise only this; its own fields are its class's."""

    @property
    def type(self) -> str: ...
