"""``ddp``: two gloo ranks train exactly what one process trains on the same global batch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from tests.distributed.conftest import free_port, launch, launch_env, losses, single


def test_ddp_matches_single_and_resumes_on_another_world_size(pretrain_data, single_pretrain, tmp_path):
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=10", "train.save_every=5"]
    one, two = single_pretrain, tmp_path / "two"
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 10
    # mlm + sp: the ranks hold different numbers of masked tokens; the count weighting makes the
    # step the single process's (fp32 rounding only)
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert losses(one, "grad_norm") == pytest.approx(losses(two, "grad_norm"), rel=1e-5)
    assert losses(one, "mlm_accuracy") == losses(two, "mlm_accuracy")

    # 2 -> 1: continue the ddp run from its step-5 checkpoint in one process
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (two / "checkpoints").rename(resumed / "checkpoints")
    for name in ("config.yaml", "tokenizer", "metrics.jsonl"):
        (two / name).rename(resumed / name)
    single(*common, f"output={resumed}", "train.resume_from=5", "train.strategy=single")
    c = losses(resumed)
    assert len(c) == 10 and max(abs(x - y) for x, y in zip(a[5:], c[5:])) < 1e-5

    # 1 -> 2: continue the single run's step-5 checkpoint on two ranks
    shutil.copytree(one, tmp_path / "widened")
    launch(2, *common, f"output={tmp_path / 'widened'}", "train.resume_from=5", "train.strategy=ddp")
    d = losses(tmp_path / "widened")
    assert len(d) == 10 and d[:5] == a[:5] and max(abs(x - y) for x, y in zip(a[5:], d[5:])) < 1e-5


def test_ddp_grad_accumulation_and_odd_rows(pretrain_data, tmp_path):
    # batch 6 on 2 ranks with 2 micro-batches per step, against one process with the same settings
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=4", "train.batch_size=6",
              "train.grad_accum=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    assert max(abs(x - y) for x, y in zip(losses(one), losses(two))) < 1e-5


def test_finetune_under_ddp_matches_single(english, pretrain_data, tmp_path):  # noqa: F811 - fixture
    # fine-tuning goes through the same session: the best model, dev and test scores come out as in one process
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    common = ["finetune", "--task", "classification", "--config", "bert/tiny", *base, f"data.train={english['train']}",
              f"data.dev={english['dev']}", f"data.test={english['test']}", "train.epochs=2", "task.head_dropout=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    assert max(abs(x - y) for x, y in zip(losses(one), losses(two))) < 1e-5
    a, b = (json.loads((run / "results.json").read_text()) for run in (one, two))
    assert a["best_step"] == b["best_step"] and a["test"] == pytest.approx(b["test"])
    assert (two / "best" / "model.safetensors").is_file()


def test_two_nodes_of_one_rank_train_like_one_node_of_two(pretrain_data, tmp_path):
    # torchrun's multi-node options on loopback: --nnodes=2 --node_rank=0/1 with a static rendezvous
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=6", "train.strategy=ddp",
              "train.threads=1"]  # two "nodes" on one 2-core machine
    launch(2, *common, f"output={tmp_path / 'one_node'}")
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
                               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", "-m",
                               "pentad", *common, f"output={tmp_path / 'two_nodes'}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=launch_env())
             for rank in (0, 1)]
    errors = [node.communicate(timeout=240)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], errors
    assert losses(tmp_path / "one_node") == losses(tmp_path / "two_nodes")
