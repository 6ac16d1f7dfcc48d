"""Writing files safely (ground floor: the standard library and ``pentad.log`` only).

* Atomic writes: a file is written under a temporary name beside it (``.NAME.`` + a random part)
  and renamed over ``NAME`` only once it is complete, so a crash leaves the old file or the new one,
  never half of one (:func:`atomic_write_text`, :func:`atomic_open`, :func:`write_json`).
  :func:`is_temporary` recognises the temporaries an interrupted write leaves.
* Temporaries that honour the umask: :func:`temporary_file` and :func:`temporary_dir` make what an
  atomic write renames into place with the permissions an ordinary ``open``/``mkdir`` would give
  (``0666``/``0777`` less the umask), not ``tempfile``'s private ``0600``/``0700``: colleagues on a shared
  cluster read a run as they read any other file there.
* Exclusive locks: :func:`take_lock` holds ``flock`` on a lock file and records the holder (pid,
  host, command, start) in it for the message a second process gets (:class:`LockBusy`). The kernel
  releases a lock however its holder ends; a forked child (a DataLoader worker) closes its copies,
  so it cannot keep a lock after its parent is gone. The run lock (``pentad.runs.RunLock``) and the
  output lock (``pentad.outputs.OutputLock``) are built on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pentad.log import info


# ----------------------------------------------------------------------------------- atomic writes
def _umask() -> int:
    mask = os.umask(0o022)  # (the only portable way to read it; set back at once)
    os.umask(mask)
    return mask


def temporary_file(directory: Path, prefix: str, suffix: str = "") -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``directory`` (descriptor, name), with the permissions the umask gives a new
    file instead of ``0600``."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, name


def temporary_dir(directory: Path, prefix: str, suffix: str = "") -> Path:
    """``tempfile.mkdtemp`` in ``directory``, with the permissions the umask gives a new directory instead
    of ``0700``."""
    made = Path(tempfile.mkdtemp(dir=directory, prefix=prefix, suffix=suffix))
    made.chmod(0o777 & ~_umask())
    return made


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, making its directory if needed."""
    with atomic_open(path) as f:
        f.write(text)


@contextlib.contextmanager
def atomic_open(path: Path, binary: bool = False) -> Iterator[Any]:
    """A file (UTF-8 text, or ``binary``) to write ``path`` incrementally: written under a temporary
    name beside it and renamed to ``path`` only when the block ends without an error, so a crash or a
    bad input line part way leaves no half-written file under the final name (streamed inference and
    embedding write their rows as the windows are done)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_file(path.parent, f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary file name beside ``path`` for a writer that takes a name rather than a file
    (``safetensors.save_file``, ``torch.save``): renamed to ``path`` when the block ends without an
    error, removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_file(path.parent, f".{path.name}.")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (UTF-8, non-ASCII kept) with a final newline, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def is_temporary(name: str) -> bool:
    """Whether a file or directory name is one an atomic write uses while it runs: ``.`` + the final
    name + ``.`` + a random part (a hidden name with a second dot). Lock files (``*.lock``) are not."""
    return name.startswith(".") and "." in name[1:] and not name.endswith(".lock")


# ------------------------------------------------------------------------------------------- locks
# Descriptors of the locks this process holds, closed in a forked child (the parent keeps its lock).
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


class LockBusy(Exception):
    """Another process holds the lock; :meth:`holder` describes it from the record in the lock file."""

    def __init__(self, record: bytes):
        super().__init__("the lock is held by another process")
        self.record = record

    def holder(self, program: str = "") -> str:
        """``pid P on host H, `PROGRAM COMMAND` started T`` (``pid unknown ...`` before the holder wrote it)."""
        try:
            holder = json.loads(self.record.decode())
            return (f"pid {holder['pid']} on host {holder['host']}, `{program}{holder['command']}` started "
                    f"{holder['started']}")
        except (ValueError, KeyError, TypeError):
            return "pid unknown: it has only just started"


def take_lock(path: Path, shown: Path | str) -> int | None:
    """Open ``path`` (created if missing; its directory must exist) and lock it exclusively without
    waiting. Returns the descriptor, to be recorded with :func:`record_holder` and given back with
    :func:`release_lock`; None where nothing can be locked (no ``fcntl``; a file system without locks,
    noted on the log naming ``shown``). Raises :class:`LockBusy` when another process holds it, and
    ``FileNotFoundError`` when the directory is gone."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        record = os.pread(fd, 4096, 0)
        os.close(fd)
        raise LockBusy(record) from None
    except OSError as e:  # a file system without locks (some network mounts): go on, unprotected
        os.close(fd)
        info(f"note: {shown} cannot be locked ({e.strerror}); make sure no other process writes it")
        return None
    _HELD.add(fd)
    return fd


def record_holder(fd: int, command: str) -> None:
    """Write this process (pid, host, ``command``, start time) into a lock file it holds."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def release_lock(fd: int) -> None:
    """Close a descriptor from :func:`take_lock`; closing the last descriptor releases the flock."""
    _HELD.discard(fd)
    os.close(fd)
