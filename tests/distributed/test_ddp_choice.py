"""Multiple choice under ``ddp``: a global batch is split between ranks by question (all of a question's
choices on one rank, ``Batch.group_padding_mask``), so two ranks train what one process trains."""

from __future__ import annotations

import json

import pytest
from tests.distributed.conftest import launch, losses, single


def test_multiple_choice_under_ddp_matches_single(shared_data, tmp_path):
    tp = shared_data
    docs = json.loads((tp / "datasets" / "c3" / "dev.json").read_text(encoding="utf-8"))
    for name, part in (("train", docs[:22]), ("dev", docs[22:34])):
        (tmp_path / f"{name}.json").write_text(json.dumps(part, ensure_ascii=False), encoding="utf-8")
    # 6 questions a batch over 2 ranks: 3 questions (12 sequences) each; the epoch's last batch is smaller
    common = ["finetune", "--task", "multiple_choice", "--config", "bert/tiny", "tokenizer.type=wordpiece",
              f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=32",
              "model.max_seq_length=48", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
              "model.encoder.ffn_size=64", "data.objective.seq_length=48", f"data.train={tmp_path / 'train.json'}",
              f"data.dev={tmp_path / 'dev.json'}", "train.epochs=2", "train.batch_size=6", "train.lr=1e-3",
              "train.log_every=1", "train.progress=false", "train.tensorboard=false", "task.head_dropout=0",
              "model.embedding.dropout=0", "model.encoder.dropout=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    single(*common, f"output={one}")
    launch(2, *common, f"output={two}", "train.strategy=ddp")
    a, b = losses(one), losses(two)
    assert len(a) == len(b) > 4 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert losses(one, "choice_accuracy") == losses(two, "choice_accuracy")
    ra, rb = (json.loads((run / "results.json").read_text()) for run in (one, two))
    assert ra["best_step"] == rb["best_step"] and ra["dev"] == pytest.approx(rb["dev"])
