"""A mixture-of-experts model under ``ddp``: dropless experts without auxiliary losses are a
per-token computation, so two gloo ranks train what one process trains; with the load-balancing
and z-losses on, each rank balances its own tokens and the losses are logged."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single

MOE = ["model.encoder.ffn=moe", "model.encoder.moe.num_experts=4", "model.encoder.moe.top_k=2",
       "model.encoder.moe.expert_ffn_size=32"]


def test_dropless_moe_under_ddp_matches_single(pretrain_data, tmp_path):
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, *MOE, "train.steps=4",
              "model.encoder.moe.balance_loss_weight=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    for key in ("loss", "mlm_loss", "grad_norm", "aux_moe_dropped"):
        a, b = losses(one, key), losses(two, key)
        assert a and len(a) == len(b) == 4, key
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6), key


def test_moe_aux_losses_train_and_log_under_ddp(pretrain_data, tmp_path):
    run = tmp_path / "aux"
    launch(2, "pretrain", "--config", "bert/tiny", *pretrain_data, *MOE, "train.steps=3",
           "model.encoder.moe.capacity_factor=1.0", "model.encoder.moe.z_loss_weight=0.001",
           f"output={run}", "train.strategy=ddp")
    balance, z, dropped = losses(run, "moe_balance_loss"), losses(run, "moe_z_loss"), losses(run, "aux_moe_dropped")
    assert len(balance) == len(z) == len(dropped) == 3
    assert all(0.0099 < b < 0.05 for b in balance)  # 0.01 * (1 when balanced .. N)
    assert all(v > 0 for v in z) and all(0 <= d < 1 for d in dropped)


@pytest.mark.heavy
def test_dropless_moe_under_fsdp_matches_single(pretrain_data, tmp_path):
    """fsdp shards each layer (experts included: the stacked expert tensors split on the expert axis)."""
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, *MOE, "train.steps=3",
              "model.encoder.moe.balance_loss_weight=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=fsdp")
    for key in ("loss", "grad_norm"):
        assert losses(two, key) == pytest.approx(losses(one, key), rel=1e-5, abs=1e-6), key


@pytest.mark.heavy
def test_dropless_moe_under_deepspeed_zero3_matches_single(pretrain_data, tmp_path):
    """DeepSpeed ZeRO-3 partitions every parameter, the stacked expert tensors included, across the
    ranks and gathers them per layer: the same losses and gradient norms as one process."""
    pytest.importorskip("deepspeed")
    from tests.distributed.test_deepspeed import ds_launch

    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, *MOE, "train.steps=3",
              "model.encoder.moe.balance_loss_weight=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    ds_launch(2, *common, f"output={two}", "train.strategy=deepspeed", "train.deepspeed.stage=3")
    for key in ("loss", "grad_norm"):
        assert losses(two, key) == pytest.approx(losses(one, key), rel=1e-5, abs=1e-6), key
