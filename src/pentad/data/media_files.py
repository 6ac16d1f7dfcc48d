"""Opening the media files (images, audio) that an examples file or a corpus names.

A path given where a media file belongs may be missing, or may be a directory, a named pipe, a device
or a socket: each is named as what it is, never reported as "does not exist", and a FIFO with no
writer is reported instead of waited on (``/dev/zero`` would otherwise be read without end).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from pentad.errors import UserError


def open_regular(path: Path, where: str, kind: str) -> IO[bytes]:
    """``path`` opened for reading in binary, after checking on the open descriptor that it is a regular
    file: a directory, FIFO, device or socket is a UserError saying which (``where`` names the path in
    messages, ``kind`` what it should be: ``image``, ``audio``). The file is opened without blocking,
    so a FIFO with no writer is reported instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{where} does not exist ({kind} paths are relative to the examples file's folder)") from None
    except OSError as error:
        raise UserError(f"{where} cannot be read ({error.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
                "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        article = "an" if kind[:1] in "aeiou" else "a"
        raise UserError(f"{where} is {what}, not {article} {kind} file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
