"""One generic registry: a kind of component maps names to (class, config class).

Components register themselves where they are defined::

    @ENCODERS.register("transformer")
    class TransformerEncoder(Encoder):
        Config = TransformerEncoderConfig   # pydantic model with ``type: Literal["transformer"]``

The config layer builds its discriminated unions from the registries, so adding a component is
adding one file; nothing else has to learn its name.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from pentad.errors import UserError, closest

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to classes for one kind of component (``embeddings``, ``encoders``, ...)."""

    def __init__(self, kind: str, singular: str | None = None):
        self.kind = kind
        self.singular = singular or (kind[:-1] if kind.endswith("s") else kind)
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def add(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name] is not cls:
                raise RuntimeError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = cls
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return add

    def get(self, name: str) -> type[T]:
        try:
            return self._entries[name]
        except KeyError:
            hint = closest(name, self._entries)
            msg = f"unknown {self.singular} '{name}'"
            msg += f"; did you mean '{hint}'?" if hint else ""
            msg += f" Known: {', '.join(sorted(self._entries))}."
            raise UserError(msg) from None

    def config_class(self, name: str) -> Any:
        return self.get(name).Config  # type: ignore[attr-defined]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, type[T]]]:
        return iter(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


EMBEDDINGS: Registry[Any] = Registry("embeddings")
ENCODERS: Registry[Any] = Registry("encoders")
DECODERS: Registry[Any] = Registry("decoders")
TARGETS: Registry[Any] = Registry("targets")
OBJECTIVES: Registry[Any] = Registry("objectives")
TASKS: Registry[Any] = Registry("tasks")
TOKENIZERS: Registry[Any] = Registry("tokenizers")
# Blocks a transformer layer is assembled from (``components/attention/``, ``components/blocks.py``) and the
# position schemes of a stack (``components/positions/``), chosen by the stack config.
ATTENTION_BLOCKS: Registry[Any] = Registry("attention blocks", "attention block")
FFN_BLOCKS: Registry[Any] = Registry("feed-forward blocks", "feed-forward block")
POSITION_SCHEMES: Registry[Any] = Registry("position schemes", "position scheme")
# The norms the configs name (``norm``, ``final_norm_kind``, ``norm_kind``), one file each in ``components/norms/``.
NORMS: Registry[Any] = Registry("norms", "norm")

ALL = {
    r.kind: r
    for r in (EMBEDDINGS, ENCODERS, DECODERS, TARGETS, OBJECTIVES, TASKS, TOKENIZERS)
}


def import_package_modules(package: str, path: Iterable[str]) -> None:
    """Import every module of the package ``package`` (its ``__name__``) found on ``path`` (its
    ``__path__``), in name order: how a package of registered parts (attention variants, position
    schemes, norms) registers each of its files, so a new part is one new file."""
    for name in sorted(m.name for m in pkgutil.iter_modules(path)):
        importlib.import_module(f"{package}.{name}")
