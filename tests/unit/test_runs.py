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
