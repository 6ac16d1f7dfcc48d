"""Checks on the output paths of commands, made before any work is done."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pentad.errors import UserError
from pentad.outputs import OutputLock, check_apart

Inputs = Iterable[tuple[str, "Path | str | None"]]


def check_output_file(path: Path, overwrite: bool, option: str = "--output", inputs: Inputs = ()) -> None:
    """``path`` may receive an output file: not a directory, not under a file, apart from the command's
    ``inputs`` (``(what, path)`` pairs: not one of them, nor a part of an input run), and new unless
    ``overwrite`` (the ``--overwrite`` flag) says to replace it."""
    check_apart(path, option, inputs, file_output=True)
    if path.is_dir():
        raise UserError(f"{option} {path} is a directory; name a file to write, e.g. {path / 'predictions.tsv'}")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{option} {path}: {blocking} is a file, so it cannot hold {path.name}; choose another path")
    if path.exists() and not overwrite:
        raise UserError(f"{option} {path} already exists; pass --overwrite to replace it, or choose another "
                        "file (outputs are never replaced silently)")
    check_writable(path, option)


@contextmanager
def claim_output_file(path: Path, overwrite: bool, option: str = "--output", inputs: Inputs = (),
                      command: str = "") -> Iterator[None]:
    """Hold ``path``'s output lock while the block writes it, checked (:func:`check_output_file`) before
    the lock is taken (no directory made for a refused output) and again under it (another writer may
    have written it in between: it is then not replaced without ``overwrite``)."""
    inputs = list(inputs)
    check_output_file(path, overwrite, option, inputs)
    with OutputLock(path, option, command):
        check_output_file(path, overwrite, option, inputs)
        yield


def check_run_dir(path: Path, key: str = "output", inputs: Inputs = ()) -> None:
    """``path`` may be a run directory: new, or an existing directory (to resume), not one of the runs or
    datasets in ``inputs`` nor inside one."""
    check_apart(path, key + "=", inputs, may_contain=True)
    if path.exists() and not path.is_dir():
        raise UserError(f"{key}={path} is a file; {key} names a run directory (new, or an earlier run to resume)")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{key}={path}: {blocking} is a file, so it cannot hold the run directory")
    check_writable(path, key + "=")


def check_writable(path: Path, option: str) -> None:
    """The nearest existing directory at or above ``path`` accepts new files (checked before the work,
    so that a read-only location fails at once rather than at the first checkpoint)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return
    shown = f"{option}{path}" if option.endswith("=") else f"{option} {path}"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise UserError(f"{shown}: {existing} is on a read-only file system; choose an output location you "
                        "can write to")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{shown}: permission denied, {existing} is not writable by this user; choose an "
                        "output location you can write to")
