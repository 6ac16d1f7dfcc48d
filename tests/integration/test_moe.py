"""A mixture-of-experts model through the CLI: pre-training logs the auxiliary losses and the dropped
fraction beside the targets', and an interrupted run resumes to the same losses bit for bit."""

from __future__ import annotations

from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

MOE = ["model.encoder.ffn=moe", "model.encoder.moe.num_experts=4", "model.encoder.moe.top_k=1",
       "model.encoder.moe.normalize=false", "model.encoder.moe.capacity_factor=1.0",
       "model.encoder.moe.router_input=word", "model.encoder.moe.every=2", "model.encoder.moe.z_loss_weight=0.001"]


def run(*argv: object) -> int:
    return main([str(a) for a in argv])


def test_moe_pretraining_logs_aux_losses_and_resumes_bitwise(english, tmp_path):
    base = tiny(english["vocab"])
    dataset = tmp_path / "ds"
    assert run("preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}",
               f"data.output={dataset}") == 0
    common = ["--config", "bert/tiny", *base, *MOE, f"data.dataset={dataset}", "train.steps=6", "train.save_every=3"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run("pretrain", *common, f"output={straight}") == 0
    records = MetricsLog(straight / "metrics.jsonl").read()
    assert len(records) == 6
    for r in records:
        assert {"mlm_loss", "sp_loss", "moe_balance_loss", "moe_z_loss", "aux_moe_dropped"} <= set(r)
        # one MoE layer of two (every: 2): its balance loss is 0.01 * (1 when balanced .. N)
        assert 0.0099 < r["moe_balance_loss"] <= 0.04 and 0 <= r["aux_moe_dropped"] < 1
        total = r["mlm_loss"] + r["sp_loss"] + r["moe_balance_loss"] + r["moe_z_loss"]
        assert abs(r["loss"] - total) < 1e-5
    assert run("pretrain", *common, f"output={split}", "train.stop_at=2") == 0
    assert run("pretrain", *common, f"output={split}") == 0
    assert [r["loss"] for r in MetricsLog(split / "metrics.jsonl").read()] == [r["loss"] for r in records]
