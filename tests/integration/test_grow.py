"""Hot-start through the CLI: pre-train a small GPT-2, `pentad grow` it wider and deeper, and pre-train
the big model from it with init=OUT: its loss at the first step is the small model's loss on the same
batch (function-preserving width growth and identity depth growth), far below a random start's."""

from __future__ import annotations

import pytest
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

NO_DROPOUT = ["model.embedding.dropout=0", "model.encoder.dropout=0"]
BIG = ["model.hidden_size=64", "model.encoder.num_heads=4", "model.encoder.ffn_size=96", "model.encoder.num_layers=3"]


def run(*argv: object) -> int:
    return main([str(a) for a in argv])


@pytest.mark.heavy  # three short pre-training runs: ~15 s on 2 shared cores
def test_grown_model_starts_at_the_small_models_loss(english, tmp_path, capsys):
    base = [*tiny(english["vocab"]), *NO_DROPOUT, "train.tensorboard=false", "train.threads=1"]
    dataset = tmp_path / "ds"
    assert run("preprocess", "--config", "gpt2/tiny", *base, f"data.corpus={english['docs']}",
               f"data.output={dataset}") == 0
    common = ["--config", "gpt2/tiny", *base, f"data.dataset={dataset}"]
    small, grown = tmp_path / "small", tmp_path / "grown"
    assert run("pretrain", *common, "train.steps=20", "train.lr=3e-3", f"output={small}") == 0
    small_losses = [r["loss"] for r in MetricsLog(small / "metrics.jsonl").read()]
    capsys.readouterr()
    assert run("grow", "--config", "gpt2/tiny", "--depth", "identity", "--output", grown, small, *base, *BIG) == 0
    summary = capsys.readouterr().out
    assert "hidden_size 32 -> 64" in summary and "encoder.num_layers 2 -> 3" in summary
    assert "function-preserving" in summary and "not function-preserving" not in summary
    # step 1 of a fresh run (same dataset and seed: the same first batch, its loss taken before the update),
    # once with the small run's weights and once with the grown ones
    same = ["train.steps=1", "train.lr=1e-9", "train.warmup=0"]
    again, big = tmp_path / "again", tmp_path / "big"
    assert run("pretrain", *common, *same, f"init={small}", f"output={again}") == 0
    assert run("pretrain", *common, *BIG, *same, f"init={grown}", f"output={big}") == 0
    small_first = MetricsLog(again / "metrics.jsonl").read()[0]["loss"]
    big_first = MetricsLog(big / "metrics.jsonl").read()[0]["loss"]
    assert abs(big_first - small_first) < 1e-4
    assert small_first < small_losses[0] - 0.5, (small_first, small_losses)  # what the big run starts from
    # refusals name the key
    capsys.readouterr()
    assert run("grow", "--config", "gpt2/tiny", "--output", tmp_path / "shrunk", small, *base, "model.hidden_size=16",
               "model.encoder.num_heads=1") != 0
    assert "model.hidden_size: the big config has 16, fewer than the small run's 32" in capsys.readouterr().err
    assert run("grow", small, "--config", "gpt2/tiny", "--output", grown) != 0
    assert "already exists" in capsys.readouterr().err
