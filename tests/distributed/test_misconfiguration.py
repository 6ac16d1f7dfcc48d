"""Misconfigured launches stop at once with exit status 2 and a message saying what to do."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
from tests.distributed.conftest import launch, single_process


def test_sharing_strategies_need_a_launcher(pretrain_data, tmp_path):
    for strategy in ("ddp",):
        proc = single_process("pretrain", "--config", "bert/tiny", *pretrain_data, f"train.strategy={strategy}",
                              f"output={tmp_path / strategy}", expect=2)
        assert f"train.strategy={strategy} runs under a launcher" in proc.stderr
        assert "torchrun --nproc_per_node=N -m pentad pretrain" in proc.stderr


def test_nccl_on_a_cpu_machine(pretrain_data, tmp_path):
    proc = single_process("pretrain", "--config", "bert/tiny", *pretrain_data, "train.dist_backend=nccl",
                          "train.device=cpu", f"output={tmp_path / 'run'}", expect=2)
    assert "train.dist_backend=nccl needs GPUs" in proc.stderr


def test_launch_errors(pretrain_data, tmp_path):
    proc = launch(2, "pretrain", "--config", "bert/tiny", *pretrain_data, f"output={tmp_path / 'a'}", expect=2)
    assert "train.strategy=single but the launcher started 2 processes" in proc.stderr
    proc = launch(2, "pretrain", "--config", "bert/tiny", *pretrain_data, "train.strategy=ddp", "train.batch_size=7",
                  f"output={tmp_path / 'b'}", expect=2)
    assert "train.batch_size=7 is not divisible by the 2 processes" in proc.stderr


def _check(rank: int, init: str, value: int, out) -> None:
    import torch.distributed as dist

    from pentad.errors import UserError
    from pentad.training.distributed import Dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        Dist(rank=rank, world_size=2, backend="gloo", launched=True).check_same("resolved config", {"lr": value})
        out.put((rank, "same"))
    except UserError as e:
        out.put((rank, str(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_ranks_with_different_configs_refuse_to_train(tmp_path):
    context = multiprocessing.get_context("spawn")
    results = {}
    for values, name in (((1, 1), "same"), ((1, 2), "differs")):
        out = context.Queue()
        init = f"file://{tmp_path / name}"
        procs = [context.Process(target=_check, args=(rank, init, values[rank], out)) for rank in range(2)]
        for p in procs:
            p.start()
        results[name] = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    assert results["same"] == {0: "same", 1: "same"}
    for message in results["differs"].values():
        assert "the resolved config differs between ranks (ranks 0; ranks 1" in message
