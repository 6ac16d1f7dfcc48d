"""Discriminated unions built from registries, so a new component needs no config edits."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Field

from pentad.registry import Registry


def _shorthand(value: Any) -> Any:
    """Let ``"word"`` stand for ``{"type": "word"}`` wherever a component config is expected."""
    if isinstance(value, str):
        return {"type": value}
    return value


def registry_union(registry: Registry) -> Any:
    """The type ``Annotated[Union[<each registered Config>], discriminator "type"]``."""
    members = tuple(registry.config_class(name) for name in registry.names())
    if not members:
        raise RuntimeError(f"no {registry.kind} registered")
    if len(members) == 1:
        return Annotated[members[0], BeforeValidator(_shorthand)]
    return Annotated[Union[members], Field(discriminator="type"), BeforeValidator(_shorthand)]  # noqa: UP007
