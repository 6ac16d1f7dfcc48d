"""Files that pentad writes honour the umask (``pentad.files``): an atomic write's temporary, renamed into
place, gets the permissions an ordinary ``open`` or ``mkdir`` would give, not ``tempfile``'s private ones."""

from __future__ import annotations

import os
import stat

import pytest

from pentad import files
from pentad.layout import staging_dir


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_honour_the_umask(tmp_path, umask):
    files.write_json(tmp_path / "a.json", {"x": 1})
    with files.atomic_open(tmp_path / "b.txt") as f:
        f.write("b")
    with files.atomic_path(tmp_path / "c.bin") as tmp:
        tmp.write_bytes(b"c")
    for name in ("a.json", "b.txt", "c.bin"):
        assert mode(tmp_path / name) == 0o666 & ~umask, name


def test_staged_directories_honour_the_umask(tmp_path, umask):
    made = files.temporary_dir(tmp_path, ".out.")
    assert mode(made) == 0o777 & ~umask
    assert mode(staging_dir(tmp_path / "run", 5)) == 0o777 & ~umask  # a checkpoint before it is published
    fd, name = files.temporary_file(tmp_path, ".f.")
    os.close(fd)
    assert mode(tmp_path / name) == 0o666 & ~umask
    assert os.umask(umask) == umask  # reading the umask left it as it was
