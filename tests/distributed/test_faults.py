"""A rank that dies or hangs stops the others with a message naming it, within train.dist_timeout;
the last checkpoint stays loadable. Two "nodes" of one rank each (two torchrun launches on
loopback), so the survivor's launcher does not simply terminate it: the survivor must notice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tests.distributed.conftest import free_port, launch_env, single


def _node(rank: int, port: int, args: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
           "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "pentad", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=launch_env())  # noqa: SIM115


def _worker(launcher: subprocess.Popen, deadline: float = 60) -> psutil.Process:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if "pentad" in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError("the worker of node 1 did not start")


def _wait_for_checkpoint(run: Path, deadline: float = 90) -> None:
    end = time.monotonic() + deadline
    while not (run / "checkpoints" / "latest").is_file():
        assert time.monotonic() < end, "no checkpoint was written"
        time.sleep(0.2)


@pytest.mark.heavy
@pytest.mark.parametrize("fault", ["killed", "hangs"])
def test_a_lost_rank_stops_the_others_with_its_name(pretrain_data, tmp_path, fault):
    run = tmp_path / "run"
    timeout = 8
    args = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=100000", "train.save_every=10",
            f"train.dist_timeout={timeout}", "train.strategy=ddp", f"output={run}"]
    port = free_port()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [_node(rank, port, args, logs[rank]) for rank in (0, 1)]
    worker = None
    try:
        worker = _worker(nodes[1])
        _wait_for_checkpoint(run)
        struck = time.monotonic()
        if fault == "killed":
            worker.send_signal(signal.SIGKILL)
        else:
            worker.send_signal(signal.SIGSTOP)
        nodes[0].wait(timeout=timeout + 45)
        took = time.monotonic() - struck
    finally:
        if worker is not None and worker.is_running():
            os.kill(worker.pid, signal.SIGKILL)
        for node in nodes:
            if node.poll() is None:
                node.kill()
            node.wait()
    text = logs[0].read_text()
    assert nodes[0].returncode != 0
    assert "rank 0: the run lost contact with other ranks" in text, text[-3000:]
    if fault == "killed":
        assert "rank 1 (pid" in text and "is gone" in text
        assert took < timeout + 30
    else:
        assert took < timeout + 40
    assert "is intact: run the same command again" in text
    # the last checkpoint loads: continue it for one step in one process
    latest = int((run / "checkpoints" / "latest").read_text().strip()[len("step-"):])
    single(*args[:-3], "train.strategy=single", f"output={run}", f"train.stop_at={latest + 1}")
