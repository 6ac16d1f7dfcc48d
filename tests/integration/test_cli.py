"""Small commands: list, schema, validate, print-config, python -m pentad."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from pentad import layout
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


def test_validate_counts_a_mixture_of_experts_on_the_meta_device(capsys):
    assert main(["validate", "deepseek-v3/671b"]) == 0  # 671B parameters: built on the meta device
    assert "parameters: 671,026,404,352 (37,552,282,624 active per token)" in capsys.readouterr().out


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
    # bf16-true from the command line: bf16 weights in the checkpoint, MFU against a given peak
    assert main(["pretrain", "--config", "bert/tiny", *base, f"data.dataset={tmp_path / 'ds'}", "train.steps=2",
                 "train.precision=bf16-true", "train.peak_tflops=0.5", f"output={tmp_path / 'true'}"]) == 0
    records = [json.loads(line) for line in (tmp_path / "true" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] > 0 and records[-1]["mfu"] > 0 and records[-1]["peak_memory_gib"] > 0
    from pentad.training import checkpoint as ckpt

    weights = ckpt.read_weights(layout.latest_checkpoint(tmp_path / "true") / layout.WEIGHTS)
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_validate_takes_the_config_first_or_as_option(capsys):
    assert main(["validate", "bert/tiny", "model.encoder.num_layers=3"]) == 0
    positional = capsys.readouterr().out
    assert main(["validate", "--config", "bert/tiny", "model.encoder.num_layers=3"]) == 0
    assert capsys.readouterr().out == positional and "transformer x3 layers" in positional
    assert main(["validate", "-c", "bert/tiny", "--print-config"]) == 0
    assert "num_layers: 2" in capsys.readouterr().out
    assert main(["validate", "model.encoder.num_layers=3"]) == 2
    assert "validate needs a config" in capsys.readouterr().err


def test_run_commands_help_lists_main_keys_that_exist(capsys):
    import pytest

    from pentad.assembly import run_config_class
    from pentad.cli.main import MAIN_KEYS

    schema = run_config_class().model_json_schema()

    def resolve(node, key):  # one level of the schema, following $ref and anyOf
        while "$ref" in node or "anyOf" in node:
            if "$ref" in node:
                node = schema["$defs"][node["$ref"].split("/")[-1]]
            else:
                node = next((n for n in node["anyOf"] if n.get("type") != "null"), node["anyOf"][0])
        if "properties" in node:
            return node["properties"][key]
        # a union of components (discriminated on type): the key exists in at least one of them
        options = [schema["$defs"][ref.split("/")[-1]] for ref in node.get("discriminator", {})
                   .get("mapping", {}).values()]
        return next(o["properties"][key] for o in options if key in o.get("properties", {}))

    for command, keys in MAIN_KEYS.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "pentad schema" in out and "docs/config.md" in out
        for key, _ in keys:
            assert key in out
            node = schema
            for part in key.split("."):
                node = resolve(node, part)  # KeyError / StopIteration: a key that does not exist


def test_list_descriptions_are_whole_sentences(capsys):
    from pentad.cli.main import summary

    for kind in ("embeddings", "encoders", "decoders", "targets", "objectives", "tasks", "tokenizers"):
        assert main(["list", kind]) == 0
        for line in capsys.readouterr().out.splitlines():
            assert line.rstrip().endswith("."), f"{kind}: {line!r} is cut"
    assert summary("First line\n  goes on. Second sentence.\n\nOther paragraph.") == \
        "First line goes on. Second sentence."
    assert summary("A ``b`` c.\nD " + "x" * 200 + ".") == "A b c."


def test_output_into_a_closed_pipe_is_not_a_traceback():
    code = "import sys; from pentad.cli.main import main; sys.exit(main(['list', 'zoo']))"
    done = subprocess.run(f"{sys.executable} -c \"{code}\" | head -1", shell=True, capture_output=True, text=True)
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def test_print_config_shows_the_command_train_defaults(capsys):
    import yaml

    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["adam_bias_correction"] is False
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny",
                 "train.adam_bias_correction=true", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["adam_bias_correction"] is True
    assert main(["pretrain", "--config", "bert/tiny", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["adam_bias_correction"] is True
