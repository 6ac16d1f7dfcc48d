"""The rules every command that writes an output follows (ground floor: stdlib, errors, log, files and layout only).

1. An output is apart from the command's inputs: it neither is one, nor contains one (``--overwrite``
   would delete it), nor lies inside one (a directory output would be written into, or deleted
   from, the run it is read from). Paths are compared resolved: symbolic links and ``..`` followed.
   A file output (predictions, embeddings) may lie inside an input run directory, beside its
   files, but may not be one of them (:data:`pentad.layout.RUN_PARTS`).
2. A writer holds the output's lock (:class:`OutputLock`) from its "does it exist" check to its last
   write, so that two processes writing one output cannot both find it missing and then write it
   together; the second is told the first holds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pentad.errors import UserError
from pentad.files import LockBusy, record_holder, release_lock, take_lock
from pentad.layout import RUN_PARTS


def resolved(path: Path | str) -> Path:
    """``path`` absolute, with ``~``, symbolic links and ``..`` resolved (as far as it exists)."""
    return Path(os.path.expanduser(path)).resolve()


def _shown(path: Path | str, real: Path) -> str:
    return f"{path}" if Path(os.path.abspath(os.path.expanduser(path))) == real else f"{path} (that is {real})"


def _named(option: str, shown: object) -> str:
    """``OUT path``, ``--output path``, ``output=path``."""
    return f"{option}{shown}" if option.endswith("=") else f"{option} {shown}"


def check_apart(output: Path | str, option: str, inputs: Iterable[tuple[str, Path | str | None]],
                file_output: bool = False, may_contain: bool = False) -> None:
    """Refuse an ``output`` (named on the command line as ``option``: ``OUT``, ``--output``, ``output=``)
    that equals, contains or lies inside one of ``inputs`` (``(what it is, path)`` pairs; a None path is
    skipped). ``file_output``: the output is one file, which may lie inside an input directory unless it
    is one of a run's parts; ``may_contain``: the output is a directory that is never deleted or
    replaced whole (a training run's), so an input inside it is safe."""
    out = resolved(output)
    for what, path in inputs:
        if path is None:
            continue
        source = resolved(path)
        where = _named(option, _shown(output, out))
        if out == source:
            raise UserError(f"{where} is the {what} {_shown(path, source)} itself: writing it would change or "
                            "destroy the input it is made from. Choose an output apart from the inputs.")
        if out in source.parents and not may_contain:
            raise UserError(f"{where} contains the {what} {_shown(path, source)}: writing (or replacing, with "
                            "--overwrite) the output would delete the input it is made from. Choose an output "
                            "that neither is, contains nor lies inside an input.")
        if source in out.parents:
            part = out.relative_to(source).parts[0]
            if file_output and source.is_dir() and part not in RUN_PARTS:
                continue
            raise UserError(f"{where} lies inside the {what} {_shown(path, source)}: writing it would change the "
                            "input while it is read (and a later --overwrite of the input would delete it). Choose "
                            "an output outside the inputs.")


def check_replaceable(output: Path, option: str, overwrite: bool, command: str) -> None:
    """A directory output ``pentad command`` writes whole: new, or (``overwrite``) an existing directory."""
    if output.is_symlink() and overwrite:  # replacing would need the link's target, or the link, gone
        raise UserError(f"{option} {output} is a symbolic link (to {resolved(output)}); name the directory itself "
                        "to replace it, or choose another output")
    if output.exists() and not overwrite:
        raise UserError(f"{option} {output} already exists; pass --overwrite to replace it, or choose another "
                        "directory (outputs are never replaced silently)")
    if output.exists() and not output.is_dir():
        raise UserError(f"{option} {output} is a file; pentad {command} writes a directory")


def lock_path(output: Path | str) -> Path:
    """The lock file of ``output``: ``.NAME.lock`` beside it (the output itself may be replaced whole)."""
    out = resolved(output)
    return out.parent / f".{out.name}.lock"


class OutputLock:
    """An exclusive lock on an output (a file or directory a command creates or replaces), held while the
    command checks and writes it: ``flock`` on :func:`lock_path`, released by the kernel however the
    holder ends. The file holds the holder's pid, host and command for the message a second writer
    gets, and is removed when the lock is released. Without ``fcntl`` (or on a file system without
    locks) the output is not locked."""

    def __init__(self, output: Path | str, option: str, command: str = ""):
        self.output, self.option, self.command = Path(output), option, command
        self.path = lock_path(output)
        self._fd: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> OutputLock:
        self._made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = take_lock(self.path, self.output)
            except FileNotFoundError:  # another writer let go and removed the directories it made
                continue
            except LockBusy as busy:
                raise UserError(f"{_named(self.option, self.output)} is being written by another pentad process "
                                f"({busy.holder()}); two writers of one output would mix or destroy each other's "
                                f"files. Wait for it to finish or stop it, or choose another output (the lock is "
                                f"{self.path}).") from None
            if fd is None:
                return self
            try:  # the previous holder removes the file as it lets go: lock the file that is there now
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            release_lock(fd)
        record_holder(fd, self.command or self.option)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # under the lock: a writer that opened it before re-opens the new file
        except OSError:
            pass
        release_lock(self._fd)  # releases the flock
        self._fd = None
        for made in self._made:  # the directories made for the lock, if the command left them empty
            try:
                os.rmdir(made)
            except OSError:
                break
