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
    assert main(["grow", str(out), "--config", str(run / "config.yaml"), "--output", str(tmp_path / "big")]) == 2
    assert "model.compression" in capsys.readouterr().err
    # nothing to do; an existing output
    assert main(["compress", str(run), "--out", str(tmp_path / "none")]) == 2
    assert main(["compress", str(run), "--out", str(out), "--quantize", "int8"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["compress", str(run), "--out", str(out), "--quantize", "int8", "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "steps").is_dir()


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


@pytest.mark.heavy
def test_distil_prune_recover_quantize_chain(english, finetuned, tmp_path):
    import json

    import yaml

    out = tmp_path / "small"
    assert main(["compress", str(finetuned), "--out", str(out), "--distill", "layers=1,epochs=1",
                 "--prune", "heads=0.5,ffn=0.5", "--recover-epochs", "1", "--quantize", "int8",
                 "--set", "train.batch_size=4"]) == 0
    record = json.loads((out / "compress.json").read_text())
    assert [s["step"] for s in record["steps"]] == ["source", "distilled", "pruned", "recovered", "quantized"]
    sizes = [s["mb"] for s in record["steps"]]
    assert sizes[1] < sizes[0] and sizes[2] < sizes[1] and sizes[4] < sizes[3]
    assert all(0.0 <= s["dev"]["accuracy"] <= 1.0 for s in record["steps"] if s["step"] in ("distilled", "recovered"))
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    compression = cfg["model"]["compression"]
    assert cfg["model"]["encoder"]["num_layers"] == 1
    assert compression["quantize"] == "int8"
    assert list(compression["heads"].values()) == [1] and list(compression["ffn"].values()) == [32]
    assert cfg["train"]["distill"]["hidden_weight"] == 1.0  # the student learnt hidden states and attention
    assert cfg["train"]["batch_size"] == 4  # --set reaches every fine-tuning step
    metrics = [json.loads(line) for line in (out / "steps" / "distilled" / "metrics.jsonl").read_text().splitlines()]
    assert any("cls_distill_loss" in m for m in metrics)
    assert main(["infer", "--model", str(out), f"data.test={english['nolabel']}",
                 "--output", str(tmp_path / "p.tsv")]) == 0
    assert len((tmp_path / "p.tsv").read_text().splitlines()) == 11


def test_prune_without_recovery_and_bad_options(english, finetuned, tmp_path, capsys):
    out = tmp_path / "pruned"
    assert main(["compress", str(finetuned), "--out", str(out), "--prune", "heads=0.5,sparsity=0.3",
                 "--recover-epochs", "0"]) == 0
    assert "sparsity: 0.3" in (out / "config.yaml").read_text()
    assert main(["infer", "--model", str(out), f"data.test={english['nolabel']}",
                 "--output", str(tmp_path / "p.tsv")]) == 0
    capsys.readouterr()
    for argv, needle in ((["--prune", "heads=2"], "below 1"), (["--distill", "epochs=1"], "layers=N"),
                         (["--distill", "layers=2"], "fewer layers than the teacher"),
                         (["--prune", "heads=0.5", "--data", str(tmp_path / "none.tsv")], "does not exist")):
        assert main(["compress", str(finetuned), "--out", str(tmp_path / "x"), *argv]) == 2
        assert needle in capsys.readouterr().err
        assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x*"))  # nothing left behind


def test_bench_measures_accuracy_and_speed(english, finetuned, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "compress.py"
    spec = importlib.util.spec_from_file_location("bench_compress", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "int8"
    assert main(["compress", str(finetuned), "--out", str(out), "--quantize", "int8"]) == 0
    assert 0.0 <= bench.accuracy(out, english["test"], tmp_path) <= 1.0
    timing = bench.timings({"fp32": finetuned, "int8": out}, english["test"], seq=16, repeats=1, threads=1)
    assert all(t["latency_ms"] > 0 and t["throughput"] > 0 for t in timing.values())
