"""Reading pydantic config classes: which classes an annotation may hold, and the class at the location
of a validation error. Used by the config loader's messages and by components with nested configs;
it depends on nothing else of pentad."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel


def unwrap(annotation: Any) -> list[Any]:
    """The concrete classes an annotation may hold (through Optional, Union, Annotated, list)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out += unwrap(arg)
        return out
    return [annotation]


def class_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config class at ``loc`` of a pydantic error (loc includes union tags)."""
    current: list[Any] = [root]
    for part in loc:
        models = [c for c in current if isinstance(c, type) and issubclass(c, BaseModel)]
        lists = [c for c in current if typing.get_origin(c) in (list, tuple)]
        if isinstance(part, int) and lists:
            current = []
            for c in lists:
                for arg in typing.get_args(c):
                    current += unwrap(arg)
            continue
        maps = [c for c in current if typing.get_origin(c) is dict]
        if isinstance(part, str) and maps and not any(part in m.model_fields for m in models):
            current = []  # a key of a mapping (a stream's name): its values' type
            for c in maps:
                current += unwrap(typing.get_args(c)[1])
            continue
        tagged = [m for m in models if m.model_fields.get("type") is not None
                  and m.model_fields["type"].default == part]
        if tagged:
            current = tagged
            continue
        nxt: list[Any] = []
        for m in models:
            if part in m.model_fields:
                nxt += unwrap(m.model_fields[part].annotation)
        if not nxt:
            return None
        current = nxt
    models = [c for c in current if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None
