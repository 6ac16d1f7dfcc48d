"""``train.lora`` under ``ddp``, ``fsdp`` and ``deepspeed`` (ZeRO-2, ZeRO-3): two gloo ranks train the
adapters as one process does, save only the adapters and the task head (sharded under fsdp, without the
frozen weights under deepspeed), resume, and their checkpoints read as the merged model."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single

from pentad import layout
from pentad.training import checkpoint as ckpt
from pentad.training import lora


@pytest.fixture(scope="module")
def lora_runs(english, pretrain_data, tmp_path_factory):  # noqa: F811 - fixture
    """A pre-trained base, the LoRA fine-tuning command on it, and that command's run in one process."""
    root = tmp_path_factory.mktemp("lora")
    single("pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=2", f"output={root / 'base'}")
    base = [a for a in pretrain_data if not a.startswith("data.dataset")]
    common = ["finetune", "--task", "classification", "--config", "bert/tiny", *base, f"init={root / 'base'}",
              f"data.train={english['train']}", f"data.dev={english['dev']}", "train.epochs=2",
              "task.head_dropout=0", "train.lora.rank=4", "train.lora.targets=[q,v,up]", "train.lr=1e-2"]
    single(*common, f"output={root / 'one'}")
    return common, root / "one"


def only_adapters_and_heads(tensors) -> bool:
    return all(lora.is_adapter_key(k) or k.startswith("targets.") for k in tensors)


def assert_merged_like(checkpoint, reference_run) -> None:
    merged, reference = ckpt.read_checkpoint_weights(checkpoint), ckpt.read_weights(
        layout.latest_checkpoint(reference_run))
    assert sorted(merged) == sorted(reference)
    assert max((merged[k] - reference[k]).abs().max().item() for k in reference) < 1e-5


def test_lora_finetune_under_ddp_matches_single(lora_runs, tmp_path):
    common, one = lora_runs
    two = tmp_path / "two"
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    a, b = losses(one), losses(two)
    assert len(a) == len(b) > 2 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert only_adapters_and_heads(ckpt.read_weights(two / "best" / "model.safetensors", merge_adapters=False))
    assert_merged_like(layout.latest_checkpoint(two), one)


@pytest.mark.heavy
def test_lora_finetune_under_fsdp(lora_runs, tmp_path):
    # the frozen base sharded with the adapters; sharded checkpoints of the adapters alone, stopped at step 3
    # and resumed: the losses of one uninterrupted process
    common, one = lora_runs
    sharded = tmp_path / "fsdp"
    launch(2, *common, f"output={sharded}", "train.strategy=fsdp", "train.stop_at=3")
    launch(2, *common, f"output={sharded}", "train.strategy=fsdp")
    a, c = losses(one), losses(sharded)
    assert len(c) == len(a) and max(abs(x - y) for x, y in zip(a, c)) < 1e-5
    last = layout.latest_checkpoint(sharded)
    assert layout.checkpoint_format(last) == layout.DCP
    assert only_adapters_and_heads(ckpt.read_checkpoint_weights(last, merge_adapters=False))
    assert_merged_like(last, one)


@pytest.mark.heavy
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_finetune_under_deepspeed(lora_runs, tmp_path, stage):
    # stopped at step 3 and resumed: the losses of one uninterrupted process
    pytest.importorskip("deepspeed")
    from tests.distributed.test_deepspeed import ds_launch

    common, one = lora_runs
    two = tmp_path / "two"
    zero = ["train.strategy=deepspeed", f"train.deepspeed.stage={stage}"]
    ds_launch(2, *common, f"output={two}", *zero, "train.stop_at=3")
    ds_launch(2, *common, f"output={two}", *zero)
    a, b = losses(one), losses(two)
    assert len(a) == len(b) > 3 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    last = layout.latest_checkpoint(two)
    assert layout.checkpoint_format(last) == "deepspeed"
    raw = ckpt.read_checkpoint_weights(last, merge_adapters=False)
    assert not any(k.startswith("encoder.") and not lora.is_adapter_key(k) for k in raw)  # no frozen weights
    assert_merged_like(last, one)
