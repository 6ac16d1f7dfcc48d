"""Errors that reach the user.

Every mistake a user can make (a config key, a data file, a path) raises a :class:`UserError`.
The command-line entry point prints its message and exits with status 2, never a traceback. A write
that fails because of where it goes (disk full, read-only, no permission) is described by
:func:`write_error_message` at the entry point; :func:`writing` labels a write with its path and size.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


class UserError(Exception):
    """A problem with the user's input: printed as one paragraph, exit status 2."""

    exit_code = 2


class Diverged(UserError):
    """Training diverged: a NaN or infinite loss, gradient norm or weights (``train.on_nonfinite``). The
    message names the step and the policy; nothing non-finite was saved, the last checkpoint is intact.
    Exit status 1: the run did not finish."""

    exit_code = 1


class RankFailure(UserError):
    """Another process of a distributed run failed or died: this rank stops too, with a message
    naming the rank(s) that are gone and the checkpoint to resume from. Exit status 1."""

    exit_code = 1


class Interrupted(Exception):
    """Training stopped by a signal after saving a checkpoint; the message says how to resume.

    The exit status is the shell's convention for a process ended by that signal (128 + its
    number: 130 for SIGINT/Ctrl-C, 143 for SIGTERM), so schedulers and scripts see that the run
    did not finish, while the checkpoint makes running the same command again continue it.
    """

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config: where it is, what was expected and what was found."""

    path: str
    message: str
    source: str = ""
    received: str | None = None
    suggestion: str | None = None

    def render(self) -> str:
        where = self.path or "<root>"
        text = f"{where}: {self.message}"
        if self.received is not None:
            text += f" (received {self.received})"
        if self.suggestion:
            text += f"; did you mean '{self.suggestion}'?"
        if self.source:
            text += f" [{self.source}]"
        return text


class ConfigError(UserError):
    """One or more config problems, all reported at once."""

    def __init__(self, problems: list[ConfigProblem], header: str = "invalid config"):
        self.problems = list(problems)
        lines = [f"{header}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))


def closest(name: str, candidates) -> str | None:
    """The candidate closest to ``name`` (for "did you mean ..."), or None if nothing is close."""
    import difflib

    found = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None


# ----------------------------------------------------------------------------- writing files
# What a failed write means, by errno; ENOSPC and EDQUOT also get the free space of the device.
_WRITE_PROBLEMS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted on the device",
    errno.EROFS: "the location is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "it is a directory, where a file was expected",
    errno.ENOTDIR: "a part of the path is a file, where a directory was expected",
    errno.EEXIST: "it already exists",
}
# torch's C++ archive writer and safetensors report a failed write without an errno.
_WRITER_FAILURES = re.compile(r"iostream error|unexpected pos|PytorchStreamWriter failed|file write failed|"
                              r"I/O error|os error \d+", re.IGNORECASE)
_OS_ERROR_NUMBER = re.compile(r"os error (\d+)")


class OutputPlace:
    """Where a write went and how many bytes it needed, attached to an exception by :func:`writing`."""

    attribute = "_pentad_output"

    def __init__(self, path: Path, needed: int | None):
        self.path, self.needed = Path(path), needed


@contextmanager
def writing(path: Path | str, needed: int | None = None) -> Iterator[None]:
    """Label any exception raised inside with the file or directory being written (and the bytes it
    needs), so that the entry point can say which output failed and how much space was missing."""
    try:
        yield
    except Exception as error:
        if getattr(error, OutputPlace.attribute, None) is None:
            try:
                setattr(error, OutputPlace.attribute, OutputPlace(Path(path), needed))
            except AttributeError:  # an exception type without a __dict__
                pass
        raise


def _mount_point(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _megabytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def space_note(path: Path, needed: int | None = None) -> str:
    """'(/mnt: 0.3 MB free of 1.0 MB, about 8.2 MB needed)' for the device that holds ``path``."""
    mount = _mount_point(path)
    try:
        usage = shutil.disk_usage(mount)
    except OSError:
        return ""
    need = f", about {_megabytes(needed)} needed" if needed else ""
    return f" ({mount}: {_megabytes(usage.free)} free of {_megabytes(usage.total)}{need})"


def _named_output(filename: str | None, outputs: Sequence[Path]) -> Path | None:
    """The path to name: the error's own file, unless it is a temporary file beside (or inside) one of
    the command's outputs (``.NAME.xyz``, written then renamed), which is then named instead."""
    if not filename:
        return outputs[0] if outputs else None
    path = Path(filename)
    for output in outputs:
        if path.name.startswith("." + output.name + ".") or output in path.parents:
            return output
    return path


def write_error_message(error: BaseException, outputs: Sequence[Path] = ()) -> str | None:
    """A one-paragraph message for a failed write (disk full, read-only, permission, a directory
    where a file goes), or None when ``error`` is not one. ``outputs`` are the command's output
    locations, named when the error itself does not say which file it was."""
    number = error.errno if isinstance(error, OSError) else None
    if number is None:
        text = str(error)
        if not _WRITER_FAILURES.search(text):
            return None
        found = _OS_ERROR_NUMBER.search(text)
        number = int(found.group(1)) if found else None
    place: OutputPlace | None = getattr(error, OutputPlace.attribute, None)
    path = place.path if place else _named_output(getattr(error, "filename", None), outputs)
    needed = place.needed if place else None
    if number is None:  # torch's writer: decide from the free space that is left
        if path is None:
            return None
        free = shutil.disk_usage(_mount_point(path)).free
        number = errno.ENOSPC if free < (needed or 0) or free < (1 << 20) else None
    if number is None:  # a writer failed, with space left: say which file and what the writer said
        return f"writing {path} failed ({error}); check the output location (free space, permissions)."
    if number not in _WRITE_PROBLEMS:
        return None
    verb = "write" if number in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else "use"
    where = f"cannot {verb} {path}" if path else f"cannot {verb} the output"
    message = f"{where}: {_WRITE_PROBLEMS[number]}"
    if number in (errno.ENOSPC, errno.EDQUOT):
        message += (space_note(path, needed) if path else "") + "; free some space or write the output elsewhere"
    elif number in (errno.EROFS, errno.EACCES, errno.EPERM):
        message += "; choose an output location you can write to"
    elif number == errno.EISDIR:
        message += "; name a file (not a directory) as the output"
    return message + "."
