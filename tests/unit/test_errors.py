"""pentad.errors: messages for failed writes (disk full, read-only, permissions, directories)."""

from __future__ import annotations

import errno
from collections import namedtuple

import pytest

from pentad import errors
from pentad.errors import write_error_message, writing

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def full_disk(monkeypatch):
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: Usage(1_000_000, 990_000, 10_000))


def test_disk_full_names_the_file_device_and_space(tmp_path, full_disk):
    target = tmp_path / "run" / "predictions.tsv"
    message = write_error_message(OSError(errno.ENOSPC, "No space left on device", str(target)))
    assert message.startswith(f"cannot write {target}: no space left on the device (")
    assert "10.0 kB free of 1.0 MB" in message and "write the output elsewhere" in message


def test_temporary_files_are_named_by_the_output_they_become(tmp_path, full_disk):
    output = tmp_path / "p.tsv"
    error = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".p.tsv.x1y2"))
    assert f"cannot write {output}:" in write_error_message(error, [output])
    inside = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ds" / ".partial" / "shard"))
    assert write_error_message(inside, [tmp_path / "ds"]).startswith(f"cannot write {tmp_path / 'ds'}: the location "
                                                                     "is on a read-only file system")


def test_writer_errors_without_errno(tmp_path, full_disk):
    # torch.save's C++ writer on a full disk: no errno, no path; `writing` labels it with both
    target = tmp_path / "checkpoints" / "step-00000002"
    with pytest.raises(RuntimeError) as info, writing(target, needed=8_200_000):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    message = write_error_message(info.value)
    assert f"cannot write {target}: no space left" in message and "about 8.2 MB needed" in message
    # safetensors says "os error 28" in its text
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert "no space left" in write_error_message(rust, [tmp_path / "run"])


def test_writer_error_with_space_left_is_still_named(tmp_path, monkeypatch):
    monkeypatch.setattr(errors.shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**12))
    with pytest.raises(RuntimeError) as info, writing(tmp_path / "w.safetensors", needed=100):
        raise RuntimeError("basic_ios::clear: iostream error")
    assert write_error_message(info.value).startswith(f"writing {tmp_path / 'w.safetensors'} failed (basic_ios")


@pytest.mark.parametrize("number,needle", [
    (errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
    (errno.EISDIR, "is a directory"), (errno.EDQUOT, "quota"),
])
def test_other_write_problems(tmp_path, number, needle):
    message = write_error_message(OSError(number, "x", str(tmp_path / "f")))
    assert needle in message and str(tmp_path / "f") in message


def test_other_errors_are_not_described(tmp_path):
    assert write_error_message(OSError(errno.ENOENT, "No such file", str(tmp_path))) is None
    assert write_error_message(RuntimeError("shape mismatch")) is None
    assert write_error_message(ValueError("tokenizer: No such file (os error 2)")) is None


def test_small_sizes_keep_their_unit(tmp_path, full_disk):
    target = tmp_path / "run" / "best.json"
    with pytest.raises(OSError) as info, writing(target, needed=20_000):
        raise OSError(errno.ENOSPC, "No space left on device")
    message = write_error_message(info.value)
    assert "(" + str(errors._mount_point(target)) + ": 10.0 kB free of 1.0 MB, about 20.0 kB needed)" in message
    assert "0.0 MB" not in message
    assert [errors.byte_size(n) for n in (0, 999, 1000, 20_000, 8_200_000, 999_960_000, 3e12)] == [
        "0 bytes", "999 bytes", "1.0 kB", "20.0 kB", "8.2 MB", "1.0 GB", "3.0 TB"]


def test_shown_values_are_bounded_whatever_their_size():
    from pentad.errors import closest, shown

    bomb: object = ["lol"] * 9
    for _ in range(8):  # nine levels of nine: 387 million strings, shared, as an expanded YAML alias bomb
        bomb = [bomb] * 9
    assert shown(bomb) == "[[[[...], [...], [...], [...], [...], [...], ...], [[...], [...], [...], [......"
    assert len(shown({"k": "x" * 10**7})) <= 80 and len(shown(b"\0" * 10**7)) <= 80
    assert shown(10**5000) == "<an integer of 16610 bits>"  # str() of it raises ValueError
    assert shown("short") == "'short'" and shown([1, 2]) == "[1, 2]" and shown(None) == "None"
    assert closest(bomb, ["linear"]) is None and closest("x" * 1000, ["linear"]) is None
    assert closest("linar", ["linear", "cosine"]) == "linear"
