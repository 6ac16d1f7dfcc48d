"""runs: which settings count as changing a resumed run's course; the run lock."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from pentad.errors import UserError
from pentad.runs import RunLock, config_changes


def raw(**train) -> dict:
    return {"model": {"hidden_size": 32}, "train": {"lr": 0.001, "steps": 10, "log_every": 10, **train},
            "data": {"dataset": "/data/ds", "workers": 1, "test": None}, "init": None, "task": None,
            "tokenizer": {"type": "wordpiece", "vocab": "/data/vocab.txt"}}


def test_trajectory_keys_are_changes_and_bookkeeping_keys_are_not():
    assert config_changes(raw(), raw(lr=0.5, log_every=1, stop_at=3)) == {"train.lr": (0.001, 0.5)}
    new = raw()
    new["data"].update(dataset="/data/other", workers=4, test="/data/test.tsv")
    assert config_changes(raw(), new) == {"data.dataset": ("/data/ds", "/data/other")}
    new = raw()
    new["task"] = {"type": "classification", "metric": "accuracy"}
    assert set(config_changes(raw(), new)) == {"task.type", "task.metric"}


def test_keys_the_command_does_not_read_are_not_changes():
    assert config_changes(raw(epochs=3), raw(epochs=5), unused=("train.epochs",)) == {}
    new = raw()
    new["task"] = {"type": "classification"}
    assert config_changes(raw(), new, unused=("task",)) == {}
    assert config_changes(raw(epochs=3), raw(epochs=5)) == {"train.epochs": (3, 5)}


def test_a_setting_of_another_pentad_version_is_not_a_change():
    old = raw()
    assert config_changes(old, raw(new_option=1.0)) == {}  # added since the run was made
    assert config_changes(raw(new_option=1.0), old) == {}


def test_relative_paths_of_older_runs_match_their_absolute_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old, new = raw(), raw()
    old["data"]["dataset"] = "ds"
    new["data"]["dataset"] = str(tmp_path / "ds")
    assert config_changes(old, new) == {}


def test_run_lock_is_exclusive_and_released(tmp_path):
    with RunLock(tmp_path / "run", "pretrain"):
        with pytest.raises(UserError, match=f"in use by another pentad process \\(pid {os.getpid()} on host"):
            RunLock(tmp_path / "run", "finetune").__enter__()
    with RunLock(tmp_path / "run", "finetune"):  # released on exit
        pass


def test_a_file_system_without_locks_is_a_note_not_an_error(tmp_path, monkeypatch, capsys):
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with RunLock(tmp_path / "run", "pretrain"):
        pass
    assert "cannot be locked (No locks available)" in capsys.readouterr().err


# ------------------------------------------------------------------------------ reading a run back
def _run_dir(tmp_path, config_text: str | None = None):
    """A run directory as pentad writes it (config.yaml naming a wordpiece tokenizer, tokenizer/), or with
    ``config_text`` as its config.yaml."""
    from pentad.assembly import load_config
    from pentad.runs import load_tokenizer, prepare_run_dir

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n", encoding="utf-8")
    cfg = load_config("bert/tiny", ["tokenizer.type=wordpiece", f"tokenizer.vocab={vocab}"])
    run = tmp_path / "run"
    prepare_run_dir(run, cfg, load_tokenizer(cfg))
    if config_text is not None:
        (run / "config.yaml").write_text(config_text, encoding="utf-8")
    return run


@pytest.mark.parametrize("text, needle", [
    ('model: !!python/object/apply:os.system ["echo run"]\n', "line 1 column 8: invalid YAML: could not determine a "
                                                             "constructor for the tag"),
    ("model: [\n", "invalid YAML"),
    ("- a list\n", "expected a mapping of keys at the top, found list"),
    ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcde", "bcdef")), "more than 100,000 values"),
])
def test_a_hostile_or_corrupt_run_config_is_a_clean_error(tmp_path, text, needle):
    from pentad.runs import load_run

    run = _run_dir(tmp_path, text)
    with pytest.raises(UserError, match=f"run config {run / 'config.yaml'}.*") as info:
        load_run(run)
    assert needle in str(info.value)


def test_a_lost_or_corrupt_tokenizer_folder_is_named(tmp_path):
    import shutil

    from pentad.runs import load_run

    run = _run_dir(tmp_path)
    assert load_run(run)[1] is not None
    (run / "tokenizer" / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match=r"tokenizer\.json is corrupt \(.*\); copy the run's tokenizer/ folder back"):
        load_run(run)
    (run / "tokenizer" / "tokenizer.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(UserError, match="expected a JSON object describing the tokenizer, found list"):
        load_run(run)
    shutil.rmtree(run / "tokenizer")
    with pytest.raises(UserError, match=f"run directory {run} has no tokenizer/tokenizer.json, though its config names "
                                        r"a tokenizer \(wordpiece\).*Copy it back"):
        load_run(run)
