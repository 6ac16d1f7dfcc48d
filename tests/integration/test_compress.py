"""``pentad compress`` end to end on tiny models: a fine-tuned classifier quantized to int8 predicts with
``pentad infer`` like its fp32 run (probabilities within tolerance); a quantized language model generates;
a quantized run cannot be trained."""

from __future__ import annotations

import csv

import pytest
import torch
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.generation import TextGenerator


def _probabilities(path):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header = rows[0]
    cols = [i for i, h in enumerate(header) if h.startswith("prob")]
    labels = [r[header.index("label")] for r in rows[1:]]
    return labels, torch.tensor([[float(r[i]) for i in cols] for r in rows[1:]])


@pytest.fixture(scope="module")
def finetuned(english, tmp_path_factory):
    run = tmp_path_factory.mktemp("compress") / "run"
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
                 f"data.train={english['train']}", f"data.dev={english['dev']}", f"output={run}",
                 "train.epochs=2"]) == 0
    return run


@pytest.mark.heavy
def test_quantized_classifier_predicts_like_fp32(english, finetuned, tmp_path, capsys):
    run = finetuned
    out = tmp_path / "int8"
    assert main(["compress", str(run), "--out", str(out), "--quantize", "int8"]) == 0
    assert "quantize: int8" in (out / "config.yaml").read_text()
    assert (out / "model.safetensors").stat().st_size < (run / "best" / "model.safetensors").stat().st_size
    preds = {}
    for name, model in (("fp32", run), ("int8", out)):
        preds[name] = tmp_path / f"{name}.tsv"
        assert main(["infer", "--model", str(model), f"data.test={english['nolabel']}", "--probabilities",
                     "--output", str(preds[name])]) == 0
    labels32, p32 = _probabilities(preds["fp32"])
    labels8, p8 = _probabilities(preds["int8"])
    assert (p32 - p8).abs().max() < 0.05  # probabilities: the int8 model is within 0.05 of the fp32 one
    assert sum(a == b for a, b in zip(labels32, labels8)) >= len(labels32) - 1

    # a quantized run is for inference only
    capsys.readouterr()
    assert main(["finetune", "--task", "classification", "--config", str(out / "config.yaml"), f"init={out}",
                 f"data.train={english['train']}", f"output={tmp_path / 'again'}", "train.epochs=1"]) == 2
    assert "inference only" in capsys.readouterr().err
    # nothing to do; an existing output
    assert main(["compress", str(run), "--out", str(tmp_path / "none")]) == 2
    assert main(["compress", str(run), "--out", str(out), "--quantize", "int8"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_quantized_language_model_generates(tmp_path):
    from tests.unit.generation.test_text_and_cli import make_run

    run = make_run(tmp_path, "gpt2")
    out = tmp_path / "int8"
    assert main(["compress", str(run), "--out", str(out), "--quantize", "int8"]) == 0
    fp32, int8 = TextGenerator.from_run(run), TextGenerator.from_run(out)
    assert any(type(m).__name__ == "QuantizedLinear" for m in int8.model.modules())
    again = TextGenerator.from_run(out)
    texts = [g.generate(["w1 w2"], max_new_tokens=6, min_new_tokens=6)[0][0] for g in (int8, again)]
    assert texts[0].token_ids == texts[1].token_ids and len(texts[0].token_ids) == 6
    assert len(fp32.generate(["w1 w2"], max_new_tokens=6, min_new_tokens=6)[0][0].token_ids) == 6
