"""Where commands write: existing outputs, directories, read-only places and full disks give a message
naming the path and exit status 2, never a traceback, and never replace a file silently."""

from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple

import pytest
from tests.integration.conftest import tiny

from pentad import files, layout
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

    monkeypatch.setattr(files, "atomic_write_text", no_space)
    monkeypatch.setattr(files, "atomic_open", no_space)  # streamed inference writes through it
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
    assert "no space left on the device" in err and "4.1 kB free of 1.0 GB, about" in err


@pytest.fixture
def boxed(finetuned, tmp_path):
    """A copy of the fine-tuned run at BOX/run (so that a writer that deleted BOX would lose only the copy)."""
    run = tmp_path / "box" / "run"
    shutil.copytree(finetuned, run)
    return run


# (command line, message): {run} is the copied run at {box}/run, {link} a symbolic link to {box}
AROUND_THE_INPUT = [
    (("export", "{run}", "{box}", "--overwrite"), "OUT {box} contains the run directory {run}"),
    (("export", "{run}", "{link}", "--overwrite"), "(that is {box}) contains the run directory"),
    (("export", "{run}", "{run}/../run", "--overwrite"), "is the run directory"),
    (("export", "{run}", "{run}/exported"), "lies inside the run directory"),
    (("compress", "{run}", "--out", "{box}", "--quantize", "int8", "--overwrite"), "--output {box} contains the run"),
    (("merge-lora", "{run}", "--output", "{link}", "--overwrite"), "contains the run directory"),
    (("grow", "{run}", "--config", "{run}/config.yaml", "--output", "{box}", "--overwrite"),
     "--output {box} contains the --config"),
    (("grow", "{run}", "--config", "bert/tiny", "--output", "{box}", "--overwrite"),
     "--output {box} contains the small run"),
    (("convert", "pentad-to-hf", "{run}", "{run}/hf"), "lies inside the input"),
    (("infer", "--model", "{run}", "data.test={test}", "--output", "{run}/config.yaml", "--overwrite"),
     "lies inside the run directory"),
    (("infer", "--model", "{run}", "data.test={test}", "--output", "{test}", "--overwrite"), "is the data.test"),
]


@pytest.mark.parametrize("argv, match", AROUND_THE_INPUT, ids=[f"{a[0]}-{i}" for i, (a, _)
                                                               in enumerate(AROUND_THE_INPUT)])
def test_no_writer_replaces_or_writes_into_its_input(capsys, english, boxed, tmp_path, argv, match):
    """``--overwrite`` onto a folder that holds the source run once deleted the run; an output inside the
    input was written into it. Both are refused, whatever the path's spelling (a symbolic link, ``..``)."""
    test = tmp_path / "test.tsv"
    shutil.copy(english["nolabel"], test)
    names = {"run": boxed, "box": boxed.parent, "link": tmp_path / "link", "test": test}
    names["link"].symlink_to(boxed.parent)
    before = {p.relative_to(boxed): p.read_bytes() for p in boxed.rglob("*") if p.is_file()}
    fails(capsys, *(a.format(**names) for a in argv), match=match.format(**names))
    assert {p.relative_to(boxed): p.read_bytes() for p in boxed.rglob("*") if p.is_file()} == before
    assert test.read_bytes() == english["nolabel"].read_bytes()


def test_a_training_run_is_not_written_into_its_init(capsys, english, boxed):
    fails(capsys, "finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
          f"data.train={english['train']}", f"init={boxed}", f"output={boxed}/../run",
          match=f"is the init {boxed} itself")


def _nested(argv, results):
    """A stand-in for a write that first runs ``pentad argv`` to completion (a second writer of the same
    output, started after the first has checked it), recording its exit status and messages."""
    def run_once(real):
        started = []

        def wrapper(*args, **kwargs):
            if not started:  # the second writer's own writes go straight through
                started.append(True)
                results.append(main([str(a) for a in argv]))
            return real(*args, **kwargs)
        return wrapper
    return run_once


def test_two_exports_to_one_new_output(capsys, boxed, tmp_path, monkeypatch):
    out, results = tmp_path / "exported", []
    monkeypatch.setattr(checkpoint, "save_tensors", _nested(("export", boxed, out), results)(checkpoint.save_tensors))
    assert main(["export", str(boxed), str(out)]) == 0
    err = capsys.readouterr().err
    assert results == [2] and f"OUT {out} is being written by another pentad process (pid {os.getpid()}" in err
    assert (out / layout.WEIGHTS).is_file() and (out / "config.yaml").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock, no staging left


def test_two_inferences_to_one_new_file(capsys, english, boxed, tmp_path, monkeypatch):
    out, results = tmp_path / "p.tsv", []
    # streamed inference writes its predictions through atomic_open
    monkeypatch.setattr(files, "atomic_open",
                        _nested(_infer(english, boxed, "--output", out), results)(files.atomic_open))
    assert main([str(a) for a in _infer(english, boxed, "--output", out)]) == 0
    assert results == [2] and "is being written by another pentad process" in capsys.readouterr().err
    assert out.read_text().startswith("label\n")


def test_two_conversions_to_one_new_directory(capsys, boxed, tmp_path, monkeypatch):
    from pentad.interop import hf

    out, results = tmp_path / "hf", []
    monkeypatch.setattr(hf, "write_json", _nested(("convert", "pentad-to-hf", boxed, out),
                                                  results)(hf.write_json))
    assert main(["convert", "pentad-to-hf", str(boxed), str(out)]) == 0
    assert results == [2] and f"OUT {out} is being written by another pentad process" in capsys.readouterr().err
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_two_compressions_to_one_output(capsys, boxed, tmp_path, monkeypatch):
    """They shared one staging folder (``.OUT.steps``), which the second deleted under the first."""
    from pentad.compression import pipeline

    out, results = tmp_path / "small", []
    monkeypatch.setattr(pipeline, "_step", _nested(("compress", boxed, "--out", out, "--quantize", "int8"),
                                                   results)(pipeline._step))
    assert main(["compress", str(boxed), "--out", str(out), "--quantize", "int8"]) == 0
    assert results == [2] and "--output" in capsys.readouterr().err
    assert (out / "compress.json").is_file() and (out / "steps").is_dir()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_preprocess_waits_for_no_one_and_mixes_nothing(capsys, english, tmp_path):
    """A dataset another process is writing (its output lock held) is refused, not written a second time."""
    from pentad.outputs import OutputLock

    out = tmp_path / "ds"
    argv = ("preprocess", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.corpus={english['bert']}",
            f"data.output={out}")
    with OutputLock(out, "data.output=", "pentad preprocess"):
        fails(capsys, *argv, match=f"data.output={out} is being written by another pentad process (pid {os.getpid()}")
        assert not out.exists()
    assert main([str(a) for a in argv]) == 0 and (out / "manifest.json").is_file()


def test_vocab_build_writes_apart_from_its_corpus_and_alone(capsys, english, tmp_path):
    """``pentad vocab build`` took neither the output rule nor the lock: a vocabulary folder around its
    corpus, or a second builder of one output, went unnoticed."""
    from pentad.outputs import OutputLock

    corpus = tmp_path / "box" / "corpus.txt"
    corpus.parent.mkdir()
    shutil.copy(english["bert"], corpus)
    build = ("vocab", "build", "--corpus", corpus, "--vocab-size", "60", "--min-frequency", "1")
    fails(capsys, *build, "--output", corpus.parent, match=f"--output {corpus.parent} contains the --corpus file")
    out = tmp_path / "vocab"
    with OutputLock(out, "--output", "pentad vocab build"):
        fails(capsys, *build, "--output", out, match=f"--output {out} is being written by another pentad process")
    assert main([str(a) for a in (*build, "--output", out)]) == 0 and (out / "vocab.txt").is_file()
