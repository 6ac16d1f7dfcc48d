"""Distillation on several ranks: each rank holds the whole teacher and scores its own rows, and two gloo
ranks train what one process trains (the same losses, soft and hard, and gradient norms) under ``ddp``,
``fsdp`` and ``deepspeed`` (ZeRO-2)."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.heavy),
                                      pytest.param("deepspeed", marks=pytest.mark.heavy)])
def test_distillation_on_two_ranks_matches_single(english, pretrain_data, tmp_path, strategy):  # noqa: F811
    env = None
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
        from tests.distributed.test_deepspeed import ds_env

        env = ds_env()
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    data = [f"data.train={english['train']}", f"data.dev={english['dev']}", "task.head_dropout=0"]
    teacher = tmp_path / "teacher"
    single("finetune", "--task", "classification", "--config", "bert/tiny", *base, *data, "train.epochs=1",
           f"output={teacher}")
    common = ["finetune", "--task", "classification", "--teacher", teacher, "--config", "bert/tiny", *base, *data,
              "model.encoder.num_layers=1", "train.epochs=2", "train.batch_size=6", "train.grad_accum=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", f"train.strategy={strategy}", env=env, timeout=600)
    for key in ("loss", "cls_distill_loss", "cls_hard_loss", "grad_norm"):
        a, b = losses(one, key), losses(two, key)
        assert a and len(a) == len(b), key
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6), key
