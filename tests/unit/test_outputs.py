"""The output rules (pentad.outputs): an output apart from the inputs, and one writer per output."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from pentad.errors import UserError
from pentad.outputs import OutputLock, check_apart, check_replaceable, lock_path


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "runs" / "ft"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    return run


def test_an_output_equal_to_containing_or_inside_an_input_is_refused(run):
    with pytest.raises(UserError, match=f"OUT {run} is the run directory {run} itself"):
        check_apart(run, "OUT", [("run directory", run)])
    with pytest.raises(UserError, match=f"OUT {run.parent} contains the run directory {run}: .* would delete"):
        check_apart(run.parent, "OUT", [("run directory", run)])
    with pytest.raises(UserError, match=f"--output {run / 'sub'} lies inside the run directory {run}"):
        check_apart(run / "sub", "--output", [("run directory", run)])
    check_apart(run.parent / "other", "OUT", [("run directory", run), ("--data", None)])  # a sibling is fine


def test_paths_are_compared_resolved(run, tmp_path):
    (tmp_path / "link").symlink_to(run.parent)
    with pytest.raises(UserError, match=f"OUT {tmp_path / 'link'} \\(that is {run.parent}\\) contains"):
        check_apart(tmp_path / "link", "OUT", [("run directory", run)])
    with pytest.raises(UserError, match="contains the run directory"):  # the input through the link
        check_apart(run.parent, "OUT", [("run directory", tmp_path / "link" / "ft")])
    with pytest.raises(UserError, match="is the run directory"):
        check_apart(run / ".." / "ft", "OUT", [("run directory", run)])


def test_a_file_output_may_lie_beside_a_runs_files_but_not_be_one(run):
    check_apart(run / "predictions.tsv", "--output", [("run directory", run)], file_output=True)
    for part in ("config.yaml", "checkpoints/latest", "model.safetensors", "interop_extra.safetensors"):
        with pytest.raises(UserError, match="lies inside the run directory"):
            check_apart(run / part, "--output", [("run directory", run)], file_output=True)
    data = run.parent / "test.tsv"
    data.write_text("text\n")
    with pytest.raises(UserError, match="is the data.test .* itself"):
        check_apart(data, "--output", [("data.test", data)], file_output=True)


def test_a_training_run_may_hold_its_inputs_but_not_be_one(run):
    check_apart(run.parent, "output=", [("init", run)], may_contain=True)
    with pytest.raises(UserError, match=f"output={run} is the init {run} itself"):
        check_apart(run, "output=", [("init", run)], may_contain=True)
    with pytest.raises(UserError, match="lies inside the init"):
        check_apart(run / "again", "output=", [("init", run)], may_contain=True)


def test_a_directory_output_is_new_or_replaced_on_request(tmp_path):
    out = tmp_path / "out"
    check_replaceable(out, "OUT", False, "export")
    out.mkdir()
    with pytest.raises(UserError, match=f"OUT {out} already exists; pass --overwrite"):
        check_replaceable(out, "OUT", False, "export")
    check_replaceable(out, "OUT", True, "export")
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(UserError, match=f"OUT {tmp_path / 'link'} is a symbolic link \\(to {out}\\)"):
        check_replaceable(tmp_path / "link", "OUT", True, "export")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file; pentad export writes a directory"):
        check_replaceable(tmp_path / "file", "OUT", True, "export")


def test_a_second_writer_of_one_output_is_refused_and_the_lock_goes_with_the_first(tmp_path):
    out = tmp_path / "new" / "out"
    with OutputLock(out, "OUT", "pentad export"):
        holder = json.loads(lock_path(out).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "pentad export"
        with pytest.raises(UserError, match=f"OUT {out} is being written by another pentad process \\(pid "
                                            f"{os.getpid()} .*`pentad export`"):
            with OutputLock(out, "OUT"):
                pass
    assert not lock_path(out).exists() and not (tmp_path / "new").exists()  # nothing left behind
    with OutputLock(out, "OUT"):  # free again
        pass


def test_the_lock_is_another_process_s_until_it_exits(tmp_path):
    out = tmp_path / "out.tsv"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pentad.outputs import OutputLock\n"
        f"with OutputLock({str(out)!r}, '--output', 'pentad infer'):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid} .*`pentad infer`"):
            with OutputLock(out, "--output"):
                pass
    finally:
        holder.communicate("\n", timeout=30)
    with OutputLock(out, "--output"):
        pass


def test_a_lock_file_removed_by_its_last_holder_is_not_locked_stale(tmp_path, monkeypatch):
    """Between opening the lock file and locking it, its holder may let go and remove it: the next
    writer then locks the file that is there, never the removed one (two holders at once)."""
    out = tmp_path / "out"
    path = lock_path(out)
    real_flock = fcntl.flock
    replaced = []

    def flock(fd, op):
        if not replaced:  # the previous holder lets go now: the opened file is unlinked, another made
            replaced.append(os.fstat(fd).st_ino)
            path.unlink()
            path.write_text("")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with OutputLock(out, "OUT") as lock:
        assert os.fstat(lock._fd).st_ino == os.stat(path).st_ino != replaced[0]


def test_a_run_directory_s_cleanup_keeps_the_lock_of_an_output_written_in_it(run):
    """Taking a run's lock clears the hidden temporaries in it; the lock of a file being written there
    (``pentad infer``'s default predictions) is not one: removed, a second writer could take it."""
    from pentad.layout import remove_temporaries

    out = run / "predictions.tsv"
    (run / ".config.yaml.tmp1234").write_text("half")
    with OutputLock(out, "--output"):
        assert remove_temporaries(run) == [run / ".config.yaml.tmp1234"]
        with pytest.raises(UserError, match="is being written by another pentad process"):
            with OutputLock(out, "--output"):
                pass
