"""The help of every ``pentad`` command, alike: one parser class and one formatter.

- An option with a default says it: ``(default: VALUE)`` is added to its help, unless the default is
  nothing to show (None, an empty list, a flag's False).
- Names that come from a registry (the tasks, the Hugging Face families, the zoo's families) are written
  in help texts as placeholders (``{tasks}``, ...) and filled from the registry when help is printed, so a
  new task is listed without editing the command line; reading a registry imports its modules (and
  torch), which building the parser must not. Choices from a module with torch are a :class:`Choices`,
  read on first use for the same reason.
- Descriptions and epilogs with line breaks are printed as written; others are wrapped.
- A renamed option keeps its old spelling as a further name of the same option, which its help calls
  "the former spelling", so scripts written for it still run (tests/unit/cli/test_help.py holds the
  preferred spellings).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload


def task_names() -> list[str]:
    """Every registered task (``--task``)."""
    import pentad.tasks  # noqa: F401  (registers the tasks)
    from pentad.registry import TASKS

    return TASKS.names()


def family_names() -> list[str]:
    """Every Hugging Face family ``pentad convert`` converts (``--family``)."""
    from pentad.interop.hf.families import family_names as names

    return names()


def zoo_families() -> list[str]:
    """The zoo's model families: the FAMILY of its FAMILY/SIZE recipes (``--config``)."""
    from pentad.config.loader import zoo_names

    return sorted({name.split("/")[0] for name in zoo_names()})


# Placeholders of help texts -> the registry read when help is printed.
LISTS: dict[str, Callable[[], Iterable[str]]] = {
    "{tasks}": task_names,
    "{families}": family_names,
    "{zoo}": zoo_families,
}


class Choices(Sequence[str]):
    """The ``choices`` of an option, read from their owner on first use (parsing a value of the option,
    or printing help): the owner may import torch, which building the parser must not. Give the option a
    ``metavar`` (argparse formats the choices of one without it as it is added) and name the choices in
    its help with ``%(choices)s``."""

    def __init__(self, load: Callable[[], Iterable[str]]):
        self._load = load
        self._names: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()


def shown_default(action: argparse.Action) -> str | None:
    """The default of ``action`` as its help shows it, or None when it has none worth showing."""
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0:  # (a flag's False/True)
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(str(v) for v in default) if default else None
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, Path):
        return str(default)
    return str(default)


def fill_lists(text: str) -> str:
    """``text`` with the registry placeholders of :data:`LISTS` replaced by the registered names."""
    for placeholder, names in LISTS.items():
        if placeholder in text:
            text = text.replace(placeholder, ", ".join(names()))
    return text


class Formatter(argparse.HelpFormatter):
    """The formatter of every pentad parser (see the module's docstring)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or text is argparse.SUPPRESS:
            return text
        text = fill_lists(text)
        shown = shown_default(action)
        if shown is not None:
            text += f" (default: {shown.replace('%', '%%')})"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:  # laid out by hand (the run commands' key tables)
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help is written by :class:`Formatter`; sub-parsers are of this class too
    (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)
