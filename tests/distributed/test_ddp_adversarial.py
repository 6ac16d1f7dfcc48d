"""Adversarial training under ``ddp``: two gloo ranks take the steps one process takes (the same losses,
adversarial losses and gradient norms), with gradient accumulation, and sharded strategies are refused."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single


@pytest.mark.parametrize("method", ["fgm", "pgd"])
def test_adversarial_ddp_matches_single(pretrain_data, tmp_path, method):
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=4", "train.batch_size=6",
              "train.grad_accum=2", f"train.adversarial.method={method}", "train.adversarial.epsilon=0.5",
              "train.adversarial.steps=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    for key in ("loss", "adv_loss", "grad_norm"):
        a, b = losses(one, key), losses(two, key)
        assert len(a) == len(b) == 4, key
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6), key


def test_adversarial_training_refuses_fsdp(pretrain_data, tmp_path):
    proc = launch(2, "pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=2", "train.strategy=fsdp",
                  "train.adversarial.method=fgm", f"output={tmp_path / 'run'}", expect=2)
    assert "not available with train.strategy=fsdp" in proc.stderr
