"""The launcher environment, device and backend choice, and thread defaults (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from pentad.errors import UserError
from pentad.training.distributed import Dist, connect, launched
from pentad.training.session import default_threads


def test_without_a_launcher_the_run_is_one_process():
    dist = connect("single", "cpu", environ={})
    assert (dist.rank, dist.world_size, dist.is_main, dist.active) == (0, 1, True, False)
    assert dist.device == torch.device("cpu")
    # the collectives are no-ops alone
    assert dist.broadcast_object({"a": 1}) == {"a": 1} and dist.gather_objects(3) == [3]
    assert dist.agree_max([1.0, 0.0]) == [1.0, 0.0]
    dist.check_same("config", {"x": 1})


def test_launch_environment_errors():
    assert launched({"RANK": "0", "WORLD_SIZE": "2"}) and not launched({"RANK": "0"})
    with pytest.raises(UserError, match="runs under a launcher"):
        connect("fsdp", "cpu", needs_launcher=True, environ={})
    with pytest.raises(UserError, match="MASTER_ADDR and MASTER_PORT not"):
        connect("ddp", "cpu", environ={"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UserError, match="WORLD_SIZE='two' is not an integer"):
        connect("ddp", "cpu", environ={"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(UserError, match="train.strategy=single but the launcher started 4 processes"):
        connect("single", "cpu", environ={"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                                          "MASTER_PORT": "1"})
    with pytest.raises(UserError, match="nccl needs GPUs"):
        connect("single", "cpu", backend_choice="nccl", environ={})
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            connect("single", "cuda", environ={})


def test_cpu_ranks_share_the_cores_among_the_ranks_of_a_machine(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu = torch.device("cpu")
    assert default_threads(Dist(world_size=4, launched=True, device=cpu), {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert default_threads(Dist(world_size=2, launched=True, device=cpu), {"LOCAL_WORLD_SIZE": "2"}) == 8
    assert default_threads(Dist(world_size=64, launched=True, device=cpu), {"LOCAL_WORLD_SIZE": "32"}) == 1
    assert default_threads(Dist(), {}) is None  # one process without a launcher: torch's default
