"""``ddp``: two gloo ranks train exactly what one process trains on the same global batch."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch, losses, single


def test_ddp_matches_single_and_resumes_on_another_world_size(pretrain_data, tmp_path):
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=10", "train.save_every=5"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
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
    assert max(abs(x - y) for x, y in zip(a[5:], c[5:])) < 1e-5


def test_ddp_grad_accumulation_and_odd_rows(pretrain_data, tmp_path):
    # batch 6 on 2 ranks with 2 micro-batches per step, against one process with the same settings
    common = ["pretrain", "--config", "bert/tiny", *pretrain_data, "train.steps=4", "train.batch_size=6",
              "train.grad_accum=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    assert max(abs(x - y) for x, y in zip(losses(one), losses(two))) < 1e-5
