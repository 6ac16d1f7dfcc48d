"""preprocess -> pretrain -> resume -> finetune -> infer, in-process through the CLI entry point."""

from __future__ import annotations

import json

from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog


def run(*argv: str) -> int:
    return main([str(a) for a in argv])


def test_whole_pipeline_and_bitwise_resume(english, tmp_path, capsys):
    base = tiny(english["vocab"])
    dataset = tmp_path / "ds"
    assert run("preprocess", "--config", "bert/tiny", *base, f"data.corpus={english['bert']}",
               f"data.output={dataset}") == 0
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["num_instances"] > 20

    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--config", "bert/tiny", *base, f"data.dataset={dataset}", "train.steps=8", "train.save_every=4"]
    assert run("pretrain", *common, f"output={straight}", "train.plot=true") == 0
    # the same run stopped after 3 steps (between checkpoints), then resumed to the end
    assert run("pretrain", *common, f"output={split}", "train.stop_at=3") == 0
    assert len(MetricsLog(split / "metrics.jsonl").read()) == 3
    assert run("pretrain", *common, f"output={split}") == 0
    a = [r["loss"] for r in MetricsLog(straight / "metrics.jsonl").read()]
    b = [r["loss"] for r in MetricsLog(split / "metrics.jsonl").read()]
    assert len(a) == 8 and a == b  # bitwise-equal losses on CPU
    assert (straight / "loss.png").stat().st_size > 1000
    assert (straight / "tokenizer" / "tokenizer.json").is_file()

    ft = tmp_path / "ft"
    assert run("finetune", "--task", "classification", "--config", "bert/tiny", *base, f"init={straight}",
               f"data.train={english['train']}", f"data.dev={english['dev']}", f"data.test={english['test']}",
               f"output={ft}", "train.epochs=2", "train.plot=true") == 0
    assert (ft / "loss.png").stat().st_size > 1000  # with the dev selection metric's panel
    results = json.loads((ft / "results.json").read_text())
    assert set(results["dev"]) == {"accuracy", "macro_f1"} and 0 <= results["test"]["accuracy"] <= 1
    assert (ft / "best" / "model.safetensors").is_file()

    out = tmp_path / "pred.tsv"
    assert run("infer", "--task", "classification", "--model", ft, f"data.test={english['nolabel']}",
               "--output", out, "--probabilities") == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "label\tprob_0\tprob_1" and len(lines) == 11
    assert all(line.split("\t")[0] in {"0", "1"} for line in lines[1:])
