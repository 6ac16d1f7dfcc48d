"""Launching pentad commands under torchrun on loopback (gloo, one thread per rank) from tests.

Every test here carries the ``distributed`` marker (CI runs them with the rest). ``launch`` picks a
free port, keeps each launch's log, and retries once when the launcher itself fails after the
ranks finished (a rare loopback hiccup of torchrun's rendezvous). ``single`` runs the one-process
reference in the test's own process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.conftest import english, tiny  # noqa: F401  (the corpus fixture)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/distributed/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.distributed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.update(extra)
    return env


def root_cause_code(stderr: str) -> int:
    """The exit status of the first rank that failed, from torchrun's summary (torchrun itself exits 1,
    and terminates the other ranks, which may show SIGTERM)."""
    found = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", stderr, re.S)
    return int(found.group(1)) if found else -1


def launch(nproc: int, *args: object, timeout: float = 240, expect: int = 0, log: Path | None = None,
           env: dict[str, str] | None = None, retries: int = 1) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc -m pentad ARGS``; asserts that the (first failed) rank exits with
    ``expect``."""
    for attempt in range(retries + 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "pentad", *map(str, args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or launch_env())
        if log is not None:
            log.write_text(proc.stdout + proc.stderr)
        code = root_cause_code(proc.stderr) if proc.returncode else 0
        # a failure that pentad reported (its "error:" line) is real; retry only a launcher hiccup
        if code == expect or attempt == retries or "error:" in proc.stderr:
            break
    assert code == expect, f"rank exit status {code}, expected {expect}:\n{proc.stderr[-6000:]}"
    return proc


def single(*args: object, expect: int = 0) -> None:
    """The same command in this process with one intra-op thread, as each launched rank has (the
    reference run: the test process has torch imported already, and a new process would spend longer
    starting than these runs take)."""
    import torch

    from pentad.cli.main import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main([str(a) for a in args])
    finally:
        torch.set_num_threads(threads)
    assert code == expect, f"exit {code}, expected {expect}"


def single_process(*args: object, expect: int = 0) -> subprocess.CompletedProcess:
    """The command as one plain process of its own (for what a real process prints and how it exits)."""
    proc = subprocess.run([sys.executable, "-m", "pentad", *map(str, args)], capture_output=True, text=True,
                          timeout=240, env=launch_env())
    assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}:\n{proc.stderr[-6000:]}"
    return proc


def losses(run: Path, key: str = "loss") -> list[float]:
    return [r[key] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r]


@pytest.fixture(scope="session")
def pretrain_data(english, tmp_path_factory):  # noqa: F811 - the imported fixture
    """A bert/tiny dataset and the overrides of a tiny, dropout-free model over it."""
    dataset = tmp_path_factory.mktemp("dist") / "ds"
    base = tiny(english["vocab"])
    single("preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}", f"data.output={dataset}")
    return [*base, f"data.dataset={dataset}", "model.embedding.dropout=0", "model.encoder.dropout=0",
            "train.tensorboard=false"]


@pytest.fixture(scope="session")
def single_pretrain(pretrain_data, tmp_path_factory) -> Path:
    """One process's 10 steps of ``pretrain_data`` with checkpoints at steps 5 and 10: the run that the
    strategies' pre-training runs are compared with (read only: copy it to continue it)."""
    run = tmp_path_factory.mktemp("single") / "one"
    single("pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=10", "train.save_every=5", f"output={run}")
    return run
