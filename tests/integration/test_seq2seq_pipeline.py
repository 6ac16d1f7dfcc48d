"""Encoder-decoder pre-training through the CLI: translation with a separate target vocabulary
(English -> Chinese news commentary) and T5 span corruption, preprocess -> pretrain -> reload."""

from __future__ import annotations

import json

import torch

from pentad.builder import build_model
from pentad.cli.main import main
from pentad.runs import load_run, load_target_tokenizer
from pentad.training.checkpoint import find_weights, load_weights, read_weights
from pentad.training.trainer import MetricsLog

SMALL = ["model.hidden_size=32", "model.encoder.num_layers=1", "model.decoder.num_layers=1",
         "model.encoder.num_heads=2", "model.decoder.num_heads=2", "model.encoder.ffn_size=64",
         "model.decoder.ffn_size=64", "model.max_seq_length=64", "train.batch_size=4", "train.steps=6",
         "train.progress=false", "train.lr=1e-3", "train.log_every=1"]


def run(*argv) -> int:
    return main([str(a) for a in argv])


def test_translation_with_its_own_target_vocabulary(shared_data, tmp_path):
    corpus = tmp_path / "mt.tsv"
    with open(shared_data / "corpora/news-commentary-v13-en-zh_sampled.txt", encoding="utf-8") as f:
        corpus.write_text("".join(next(f) for _ in range(120)), encoding="utf-8")
    source = ["tokenizer.type=wordpiece", f"tokenizer.vocab={shared_data / 'models/google_uncased_en_vocab.txt'}"]
    target = ["data.objective.target_tokenizer.type=wordpiece",
              f"data.objective.target_tokenizer.vocab={shared_data / 'models/google_zh_vocab.txt'}",
              "data.objective.seq_length=48", "data.objective.target_seq_length=48"]
    dataset, out = tmp_path / "ds", tmp_path / "run"
    assert run("preprocess", "--config", "transformer/base", *source, *target, f"data.corpus={corpus}",
               f"data.output={dataset}") == 0
    assert run("pretrain", "--config", "transformer/base", *source, *target, *SMALL,
               "model.share_embedding=false", "model.embedding.parts.1.max_positions=64",
               "model.target_embedding.parts.1.max_positions=64",
               f"data.dataset={dataset}", f"output={out}") == 0
    assert len(MetricsLog(out / "metrics.jsonl").read()) == 6
    cfg, tokenizer = load_run(out)
    target_tokenizer = load_target_tokenizer(out)
    assert tokenizer.vocab_size == 30522 and target_tokenizer.vocab_size == 21128
    assert cfg.model.vocab_size == 30522 and cfg.model.target_vocab_size == 21128
    model = build_model(cfg.model)
    load_weights(model, read_weights(find_weights(out)), str(out))
    assert model.target_embedding.word.weight.shape[0] == 21128
    assert model.targets["lm"].output.weight.shape[0] == 21128
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["num_instances"] >= 100


def test_t5_span_corruption_pretrains(shared_data, tmp_path):
    corpus = tmp_path / "docs.txt"
    with open(shared_data / "corpora/CLUECorpusSmall_sampled.txt", encoding="utf-8") as f:
        corpus.write_text("".join(next(f) for _ in range(60)), encoding="utf-8")
    tok = ["tokenizer.type=wordpiece", f"tokenizer.vocab={shared_data / 'models/google_zh_with_sentinel_vocab.txt'}"]
    dataset, out = tmp_path / "ds", tmp_path / "run"
    assert run("preprocess", "--config", "t5/small", *tok, "data.objective.seq_length=48", f"data.corpus={corpus}",
               f"data.output={dataset}") == 0
    assert run("pretrain", "--config", "t5/small", *tok, *SMALL, "data.objective.seq_length=48",
               f"data.dataset={dataset}", f"output={out}") == 0
    losses = [r["loss"] for r in MetricsLog(out / "metrics.jsonl").read()]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
