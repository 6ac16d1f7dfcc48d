"""Reading a raw corpus as a stream of numbered line chunks, without ever holding it whole.

``read_chunks`` cuts the file into chunks of about ``chunk_bytes`` at line boundaries (at document
boundaries where the objective needs whole documents), or of at most ``chunk_lines`` lines where each
line is costly (an image or audio file to decode: a list of 30,000 of them is under 1 MB). Chunk
boundaries depend only on the file and those sizes, never on the number of worker processes, so the
instances built from them, and their order, are the same whatever ``workers`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pentad.errors import UserError

# A chunk that finds no allowed boundary (e.g. a "document" with no blank line for megabytes) is
# cut anyway once it is this many times ``chunk_bytes``, so memory stays bounded.
HARD_LIMIT_FACTOR = 16


class BadLine(Exception):
    """A corpus line that cannot be used: not UTF-8, or not in the objective's format.

    The message says what is wrong with the line; the caller adds the file and line number.
    """


@dataclass
class Chunk:
    """Consecutive raw lines of the corpus: ``lines[k]`` is line ``first_line + k`` (1-based)."""

    index: int
    first_line: int
    lines: list[bytes]
    num_bytes: int


def check_corpus(path: Path) -> int:
    """The size in bytes of the corpus ``path``; UserError if it is missing, a directory or empty."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"corpus file {path} does not exist (data.corpus).")
    if not path.is_file():
        raise UserError(f"corpus {path} is not a file (data.corpus expects one text file).")
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"corpus file {path} is empty.")
    return size


def decode_line(raw: bytes, line_no: int) -> str:
    """The text of one raw line without its line break; BadLine if it is not UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(f"is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte offset "
                      f"{exc.start} of the line)") from None
    if line_no == 1 and text.startswith("\ufeff"):  # a byte-order mark some editors write
        text = text[1:]
    return text.rstrip("\r\n")


def first_line(path: Path) -> tuple[bytes, int]:
    """The raw first line of ``path`` and its size in bytes."""
    with open(path, "rb") as f:
        raw = f.readline()
    return raw, len(raw)


def count_lines(path: Path) -> int:
    """The number of lines of ``path`` (a last line without a line break counts), read in 1 MB blocks."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def is_blank(raw: bytes) -> bool:
    """Whether a raw line holds only whitespace (a document separator in sentence corpora)."""
    return not raw.strip()


def read_chunks(path: Path, chunk_bytes: int, can_end_after: Callable[[bytes], bool] | None = None,
                skip_lines: int = 0, chunk_lines: int | None = None) -> Iterator[Chunk]:
    """Chunks of about ``chunk_bytes`` of ``path``, read line by line.

    Args:
        chunk_bytes: a chunk ends at the first allowed boundary after this many bytes.
        can_end_after: whether a chunk may end after a given raw line (None: after any line).
        skip_lines: leading lines not to yield (a header already read).
        chunk_lines: a chunk also ends at the first allowed boundary after this many lines (None: no
            such limit), so that work splits by items when each line is costly.
    """
    hard_limit = chunk_bytes * HARD_LIMIT_FACTOR
    lines: list[bytes] = []
    size = 0
    index = 0
    first = skip_lines + 1
    line_no = 0
    with open(path, "rb") as f:
        for raw in f:
            line_no += 1
            if line_no <= skip_lines:
                continue
            lines.append(raw)
            size += len(raw)
            boundary = can_end_after is None or can_end_after(raw)
            full = size >= chunk_bytes or (chunk_lines is not None and len(lines) >= chunk_lines)
            if (full and boundary) or size >= hard_limit:
                yield Chunk(index, first, lines, size)
                index, first, lines, size = index + 1, line_no + 1, [], 0
    if lines:
        yield Chunk(index, first, lines, size)
