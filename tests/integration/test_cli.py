"""Small commands: list, schema, validate, print-config, python -m pentad."""

from __future__ import annotations

import json
import subprocess
import sys

from pentad.cli.main import main


def test_list_every_kind(capsys):
    for kind in ("embeddings", "encoders", "targets", "objectives", "tasks", "tokenizers", "zoo"):
        assert main(["list", kind]) == 0
    out = capsys.readouterr().out
    for name in ("word", "transformer", "mlm", "bert", "classification", "wordpiece", "bert/base", "gpt2/xl"):
        assert name in out


def test_schema_is_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"model", "data", "train", "tokenizer", "task"} <= set(schema["properties"])


def test_validate_prints_summary_and_parameters(capsys):
    assert main(["validate", "bert/base"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 110,106,428" in out and "encoder: transformer x12 layers" in out


def test_validate_tencentpretrain_config(capsys, tp):
    assert main(["validate", str(tp / "configs/bert/base_config.json"), "vocab_size=21128"]) == 0
    assert "parameters:" in capsys.readouterr().out


def test_print_config_is_loadable(capsys, tmp_path):
    assert main(["pretrain", "--config", "gpt2/tiny", "train.lr=0.001", "--print-config"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0
    assert "lr: 0.001" in text


def test_python_dash_m():
    done = subprocess.run([sys.executable, "-m", "pentad", "validate", "bert/tiny", "model.encoder.num_heads=3"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "num_heads" in done.stderr and "Traceback" not in done.stderr


def test_bf16_and_grad_accum_pretraining_runs(english, tmp_path):
    from tests.integration.conftest import tiny

    base = tiny(english["vocab"])
    assert main(["preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}",
                 f"data.output={tmp_path / 'ds'}"]) == 0
    assert main(["pretrain", "--config", "bert/tiny", *base, f"data.dataset={tmp_path / 'ds'}", "train.steps=2",
                 "train.precision=bf16", "train.grad_accum=2", "train.schedule=cosine",
                 f"output={tmp_path / 'run'}"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] > 0 for r in records)
