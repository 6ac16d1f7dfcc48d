"""Streaming a corpus in numbered chunks."""

from __future__ import annotations

import pytest

from pentad.data.corpus import BadLine, check_corpus, count_lines, decode_line, is_blank, read_chunks
from pentad.errors import UserError


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_chunks_cover_the_file_with_correct_line_numbers(tmp_path):
    lines = [f"line {i} ".encode() * (i % 7 + 1) for i in range(1, 301)]
    path = write_lines(tmp_path / "c.txt", lines)
    chunks = list(read_chunks(path, chunk_bytes=500))
    assert len(chunks) > 5
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert b"".join(b"".join(c.lines) for c in chunks) == path.read_bytes()
    for chunk in chunks:
        assert chunk.lines[0].startswith(f"line {chunk.first_line} ".encode())
        assert chunk.num_bytes == sum(map(len, chunk.lines))


def test_chunks_end_only_at_allowed_boundaries(tmp_path):
    lines = []
    for doc in range(40):
        lines += [f"doc {doc} sentence {k}".encode() for k in range(doc % 5 + 1)] + [b""]
    path = write_lines(tmp_path / "c.txt", lines)
    chunks = list(read_chunks(path, chunk_bytes=100, can_end_after=is_blank))
    assert len(chunks) > 3
    assert all(is_blank(c.lines[-1]) for c in chunks)


def test_hard_limit_cuts_a_chunk_without_boundary(tmp_path):
    path = write_lines(tmp_path / "c.txt", [b"x" * 50] * 100)
    chunks = list(read_chunks(path, chunk_bytes=10, can_end_after=is_blank))
    assert len(chunks) > 1 and max(c.num_bytes for c in chunks) <= 10 * 16 + 51


def test_skip_lines_keeps_numbering(tmp_path):
    path = write_lines(tmp_path / "c.txt", [b"header", b"a", b"b"])
    (chunk,) = read_chunks(path, chunk_bytes=1 << 20, skip_lines=1)
    assert chunk.first_line == 2 and chunk.lines == [b"a\n", b"b\n"]


def test_chunks_of_file_naming_lines_end_by_count_not_only_bytes(tmp_path):
    path = write_lines(tmp_path / "list.txt", [b"path", *(f"img/{i}.png".encode() for i in range(10))])
    chunks = list(read_chunks(path, chunk_bytes=1 << 20, skip_lines=1, chunk_lines=4))
    assert [len(c.lines) for c in chunks] == [4, 4, 2] and [c.first_line for c in chunks] == [2, 6, 10]
    assert [c.index for c in chunks] == [0, 1, 2]
    assert len(list(read_chunks(path, chunk_bytes=1 << 20, skip_lines=1))) == 1  # without the count: one chunk
    assert count_lines(path) == 11
    (tmp_path / "open.txt").write_bytes(b"a\nb")  # a last line without its line break counts
    assert count_lines(tmp_path / "open.txt") == 2


def test_decode_line():
    assert decode_line("\ufeffhé\r\n".encode(), 1) == "hé"
    assert decode_line(b"abc\n", 7) == "abc"
    with pytest.raises(BadLine, match="not valid UTF-8"):
        decode_line(b"ab\xff\n", 3)


def test_check_corpus_errors(tmp_path):
    with pytest.raises(UserError, match="missing.txt does not exist"):
        check_corpus(tmp_path / "missing.txt")
    with pytest.raises(UserError, match="not a file"):
        check_corpus(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(UserError, match="empty.txt is empty"):
        check_corpus(tmp_path / "empty.txt")
    assert check_corpus(write_lines(tmp_path / "ok.txt", [b"x"])) == 2
