"""``train.lora`` under ``ddp`` and ``fsdp``: two gloo ranks train the adapters as one process does, save
only the adapters and the task head (sharded under fsdp), resume, and their checkpoints read as the merged
model; the same under ``deepspeed`` (ZeRO-2 and ZeRO-3), whose checkpoints leave the frozen weights out."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single

from pentad.training import checkpoint as ckpt
from pentad.training import lora


def test_lora_finetune_under_ddp_matches_single(english, pretrain_data, tmp_path):  # noqa: F811 - fixture
    base_run = tmp_path / "base"
    single("pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=2", f"output={base_run}")
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    common = ["finetune", "--task", "classification", "--config", "bert/tiny", *base, f"init={base_run}",
              f"data.train={english['train']}", f"data.dev={english['dev']}", "train.epochs=2",
              "task.head_dropout=0", "train.lora.rank=4", "train.lora.targets=[q,v,up]", "train.lr=1e-2"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    a, b = losses(one), losses(two)
    assert len(a) == len(b) > 2 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    raw = ckpt.read_weights(two / "best" / "model.safetensors", merge_adapters=False)
    assert all(lora.is_adapter_key(k) or k.startswith("targets.") for k in raw)

    # fsdp: the frozen base sharded with the adapters; sharded checkpoints of the adapters alone
    sharded, split = tmp_path / "fsdp", tmp_path / "fsdp_split"
    launch(2, *common, f"output={sharded}", "train.strategy=fsdp")
    c = losses(sharded)
    assert len(c) == len(a) and max(abs(x - y) for x, y in zip(a, c)) < 1e-5
    last = ckpt.latest_checkpoint(sharded)
    assert ckpt.checkpoint_format(last) == ckpt.DCP
    raw = ckpt.read_checkpoint_weights(last, merge_adapters=False)
    assert all(lora.is_adapter_key(k) or k.startswith("targets.") for k in raw)
    merged, reference = ckpt.read_checkpoint_weights(last), ckpt.read_weights(ckpt.latest_checkpoint(one))
    assert sorted(merged) == sorted(reference)
    assert max((merged[k] - reference[k]).abs().max().item() for k in reference) < 1e-5
    launch(2, *common, f"output={split}", "train.strategy=fsdp", "train.stop_at=3")
    launch(2, *common, f"output={split}", "train.strategy=fsdp")
    assert losses(split) == c


@pytest.mark.heavy
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_finetune_under_deepspeed(english, pretrain_data, tmp_path, stage):  # noqa: F811 - fixture
    pytest.importorskip("deepspeed")
    from tests.distributed.test_deepspeed import ds_launch

    base_run = tmp_path / "base"
    single("pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=2", f"output={base_run}")
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    common = ["finetune", "--task", "classification", "--config", "bert/tiny", *base, f"init={base_run}",
              f"data.train={english['train']}", f"data.dev={english['dev']}", "train.epochs=2",
              "task.head_dropout=0", "train.lora.rank=4", "train.lora.targets=[q,v,up]", "train.lr=1e-2"]
    one, two, split = tmp_path / "one", tmp_path / "two", tmp_path / "split"
    single(*common, f"output={one}")
    zero = ["train.strategy=deepspeed", f"train.deepspeed.stage={stage}"]
    ds_launch(2, *common, f"output={two}", *zero)
    a, b = losses(one), losses(two)
    assert len(a) == len(b) > 2 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    last = ckpt.latest_checkpoint(two)
    assert ckpt.checkpoint_format(last) == "deepspeed"
    raw = ckpt.read_checkpoint_weights(last, merge_adapters=False)
    assert not any(k.startswith("encoder.") and not lora.is_adapter_key(k) for k in raw)  # no frozen weights
    merged, reference = ckpt.read_checkpoint_weights(last), ckpt.read_weights(ckpt.latest_checkpoint(one))
    assert sorted(merged) == sorted(reference)
    assert max((merged[k] - reference[k]).abs().max().item() for k in reference) < 1e-5
    ds_launch(2, *common, f"output={split}", *zero, "train.stop_at=3")
    ds_launch(2, *common, f"output={split}", *zero)
    assert max(abs(x - y) for x, y in zip(losses(split), b)) < 1e-6
