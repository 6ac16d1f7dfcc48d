"""Where commands write: existing outputs, directories, read-only places and full disks give a message
naming the path and exit status 2, never a traceback, and never replace a file silently."""

from __future__ import annotations

import errno
import os
from collections import namedtuple

import pytest
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training import checkpoint


def fails(capsys, *argv, match: str) -> str:
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and match in err, err
    return err


@pytest.fixture(scope="module")
def finetuned(english, tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "ft"
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                 f"data.train={english['train']}", "train.epochs=1", f"output={out}"]) == 0
    return out


def _infer(english, finetuned, *extra):
    return ("infer", "--model", finetuned, f"data.test={english['nolabel']}", *extra)


def test_infer_never_replaces_an_existing_file(capsys, english, finetuned, tmp_path):
    kept = tmp_path / "mine.tsv"
    kept.write_text("precious\n")
    fails(capsys, *_infer(english, finetuned, "--output", kept), match=f"--output {kept} already exists; pass "
                                                                      "--overwrite")
    assert kept.read_text() == "precious\n"
    assert main([str(a) for a in _infer(english, finetuned, "--output", kept, "--overwrite")]) == 0
    assert kept.read_text().startswith("label\n")
    # the default output inside the run directory follows the same rule
    assert main([str(a) for a in _infer(english, finetuned)]) == 0
    fails(capsys, *_infer(english, finetuned), match="predictions.tsv already exists")
    assert main([str(a) for a in _infer(english, finetuned, "--overwrite")]) == 0


def test_infer_output_that_is_a_directory_or_under_a_file(capsys, english, finetuned, tmp_path):
    fails(capsys, *_infer(english, finetuned, "--output", tmp_path), match=f"--output {tmp_path} is a directory")
    (tmp_path / "file").write_text("x")
    fails(capsys, *_infer(english, finetuned, "--output", tmp_path / "file" / "p.tsv"),
          match=f"{tmp_path / 'file'} is a file")


def test_infer_task_must_match_the_run(capsys, english, finetuned, tmp_path):
    fails(capsys, *_infer(english, finetuned, "--task", "ner", "--output", tmp_path / "p.tsv"),
          match="--task ner does not match the run: ")
    assert not (tmp_path / "p.tsv").exists()
    assert main([str(a) for a in _infer(english, finetuned, "--task", "classification", "--output",
                                        tmp_path / "p.tsv")]) == 0


def test_read_only_output_location_fails_before_the_work(capsys, english, finetuned, tmp_path, monkeypatch):
    real = os.statvfs
    read_only = tmp_path / "ro"
    read_only.mkdir()

    def statvfs(path):
        result = real(path)
        if os.fspath(path) == os.fspath(read_only):
            return namedtuple("StatVfs", "f_flag")(result.f_flag | os.ST_RDONLY)
        return result

    monkeypatch.setattr(os, "statvfs", statvfs)
    fails(capsys, *_infer(english, finetuned, "--output", read_only / "p.tsv"),
          match=f"{read_only} is on a read-only file system")
    fails(capsys, "pretrain", "--config", "bert/tiny", *tiny(english["vocab"]), f"output={read_only / 'run'}",
          "data.dataset=unused", match="read-only file system")


def test_run_output_that_is_a_file(capsys, english, tmp_path):
    (tmp_path / "f").write_text("x")
    fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
          f"data.train={english['train']}", f"output={tmp_path / 'f'}", match=f"output={tmp_path / 'f'} is a file")


def test_disk_full_while_writing_predictions(capsys, english, finetuned, tmp_path, monkeypatch):
    def no_space(path, text=None, binary=False):
        raise OSError(errno.ENOSPC, "No space left on device", str(path.parent / f".{path.name}.tmp123"))

    monkeypatch.setattr(checkpoint, "atomic_write_text", no_space)
    monkeypatch.setattr(checkpoint, "atomic_open", no_space)  # streamed inference writes through it
    out = tmp_path / "p.tsv"
    fails(capsys, *_infer(english, finetuned, "--output", out),
          match=f"cannot write {out}: no space left on the device ({tmp_path.anchor}")


def test_disk_full_while_checkpointing(capsys, english, tmp_path, monkeypatch):
    """torch.save's C++ writer reports a full disk as a bare RuntimeError: the message still says what
    happened, where, and how much the checkpoint needs."""
    def torch_save(obj, path):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(checkpoint.torch, "save", torch_save)
    monkeypatch.setattr("pentad.errors.shutil.disk_usage", lambda path: Usage(10**9, 10**9 - 4096, 4096))
    err = fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                f"data.train={english['train']}", "train.epochs=1", f"output={tmp_path / 'ft'}",
                match=f"cannot write {tmp_path / 'ft' / 'checkpoints'}")
    assert "no space left on the device" in err and "0.0 MB free of 1,000.0 MB, about" in err
