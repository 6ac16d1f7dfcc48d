"""``train.lora`` through the commands: pre-train a tiny base, adapt it with LoRA (pre-training and
fine-tuning), resume, ``pentad infer`` on the adapters, ``pentad merge-lora``, the same predictions
from the merged run, and the merged run converted to Hugging Face."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training import checkpoint as ckpt
from pentad.training import lora
from pentad.training.trainer import MetricsLog


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def base_run(english, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    common = tiny(english["vocab"])
    assert run("preprocess", "--config", "bert/tiny", *common, f"data.corpus={english['bert']}",
               f"data.output={root / 'ds'}") == 0
    assert run("pretrain", "--config", "bert/tiny", *common, f"data.dataset={root / 'ds'}", "train.steps=3",
               f"output={root / 'base'}") == 0
    return root, common


def test_lora_pretraining_trains_only_adapters_and_merges(base_run, tmp_path, capsys):
    root, common = base_run
    base = root / "base"
    out = tmp_path / "lora_pt"
    assert run("pretrain", "--config", "bert/tiny", *common, f"data.dataset={root / 'ds'}", "train.steps=4",
               f"init={base}", "train.lora.rank=4", "train.lora.targets=[q,k,v,o,up,down]", "train.lr=1e-2",
               f"output={out}") == 0
    assert "LoRA rank 4 (alpha 16) on q, k, v, o, up, down of 8 projection(s)" in capsys.readouterr().err
    saved = ckpt.find_weights(out)
    raw = ckpt.read_weights(saved, merge_adapters=False)
    assert raw and all(lora.is_adapter_key(k) for k in raw)  # pre-training heads stay frozen: adapters only
    base_file = ckpt.find_weights(base)
    assert saved.stat().st_size * 3 < base_file.stat().st_size
    assert json.loads(ckpt.read_metadata(saved)[lora.METADATA_KEY])["base"] == str(base_file.resolve())
    base_tensors, merged = ckpt.read_weights(base_file), ckpt.read_weights(saved)
    assert set(merged) == set(base_tensors)
    adapted = {f"{m}.weight" for m in json.loads(ckpt.read_metadata(saved)[lora.METADATA_KEY])["modules"]}
    for key, value in base_tensors.items():
        assert torch.equal(merged[key], value) == (key not in adapted), key

    # merge-lora: a plain run directory, without train.lora, that converts to Hugging Face
    flat = tmp_path / "merged"
    assert run("merge-lora", out, "--output", flat) == 0
    assert "merged the LoRA adapters" in capsys.readouterr().out
    assert yaml.safe_load((flat / "config.yaml").read_text())["train"]["lora"] is None
    for key, value in ckpt.read_weights(flat / "model.safetensors").items():
        assert torch.equal(value, merged[key]), key
    assert run("export", out, tmp_path / "exported") == 0  # export reads the adapters merged, too
    for key, value in ckpt.read_weights(tmp_path / "exported" / "model.safetensors").items():
        assert torch.equal(value, merged[key]), key
    assert run("merge-lora", out, "--output", flat) == 2  # never replaced silently
    assert run("merge-lora", base, "--output", tmp_path / "x") == 2  # not a LoRA run
    pytest.importorskip("transformers")
    assert run("convert", "pentad-to-hf", flat, tmp_path / "hf", "--verify") == 0


def test_lora_finetune_infer_merge_and_resume(base_run, english, tmp_path, capsys):
    root, common = base_run
    task = ["finetune", "--task", "classification", "--config", "bert/tiny", *common, f"init={root / 'base'}",
            f"data.train={english['train']}", f"data.dev={english['dev']}", "train.epochs=2",
            "train.lora.rank=4", "train.lora.targets=[attention]", "train.lr=1e-2"]
    ft = tmp_path / "ft"
    assert run(*task, f"output={ft}") == 0
    best = ft / "best" / "model.safetensors"
    raw = ckpt.read_weights(best, merge_adapters=False)
    heads = {k for k in raw if not lora.is_adapter_key(k)}
    assert heads and all(k.startswith("targets.") for k in heads)  # the new task head trains and is saved
    assert best.stat().st_size * 3 < ckpt.find_weights(root / "base").stat().st_size

    # infer on the adapters (merged with the base on reading), then on the merged run: the same predictions
    pred, merged_pred, flat = tmp_path / "a.tsv", tmp_path / "b.tsv", tmp_path / "flat"
    assert run("infer", "--model", ft, f"data.test={english['nolabel']}", "--output", pred, "--probabilities") == 0
    assert run("merge-lora", ft, "--output", flat) == 0
    assert (flat / "labels.json").is_file()
    assert run("infer", "--model", flat, f"data.test={english['nolabel']}", "--output", merged_pred,
               "--probabilities") == 0
    a = [line.split("\t") for line in pred.read_text().splitlines()]
    b = [line.split("\t") for line in merged_pred.read_text().splitlines()]
    assert len(a) == 11 and [r[0] for r in a] == [r[0] for r in b]
    for x, y in zip(a[1:], b[1:]):
        assert all(abs(float(p) - float(q)) < 1e-4 for p, q in zip(x[1:], y[1:]))

    # stopped after 3 steps and resumed: the same losses as the straight run
    split = tmp_path / "split"
    assert run(*task, f"output={split}", "train.stop_at=3") == 0
    assert run(*task, f"output={split}") == 0
    straight_losses = [r["loss"] for r in MetricsLog(ft / "metrics.jsonl").read() if "loss" in r]
    split_losses = [r["loss"] for r in MetricsLog(split / "metrics.jsonl").read() if "loss" in r]
    assert len(straight_losses) > 3 and split_losses == straight_losses


def test_lora_refuses_a_missing_base_and_unsupported_strategies(english, tmp_path, capsys):
    common = tiny(english["vocab"])
    assert run("finetune", "--task", "classification", "--config", "bert/tiny", *common,
               f"data.train={english['train']}", "train.lora.rank=2", f"output={tmp_path / 'a'}") == 2
    assert "train.lora needs base weights" in capsys.readouterr().err


def _slice(source, target, start: int, rows: int):
    lines = source.read_text(encoding="utf-8").splitlines()
    target.write_text("\n".join([lines[0], *lines[1 + start:1 + start + rows]]) + "\n", encoding="utf-8")
    return target


def test_lora_on_a_real_slice_infers_the_same_before_and_after_merging(tp, tmp_path):
    # book_review (Chinese sentiment): a tiny classifier fine-tuned on 300 reviews is the base; LoRA adapts
    # its attention and trains its head on 300 others; predictions on 40 unlabelled reviews
    reviews = tp / "datasets" / "book_review"
    train_a = _slice(reviews / "train.tsv", tmp_path / "a.tsv", 0, 300)
    train_b = _slice(reviews / "train.tsv", tmp_path / "b.tsv", 300, 300)
    dev = _slice(reviews / "dev.tsv", tmp_path / "dev.tsv", 0, 60)
    test = _slice(reviews / "test_nolabel.tsv", tmp_path / "test.tsv", 0, 40)
    model = ["--task", "classification", "--config", "bert/tiny", "tokenizer.type=wordpiece",
             f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=64",
             "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
             "model.encoder.ffn_size=128", "train.batch_size=32", "train.progress=false", "train.log_every=5",
             f"data.dev={dev}"]
    base, adapted, merged = tmp_path / "base", tmp_path / "adapted", tmp_path / "merged"
    assert run("finetune", *model, f"data.train={train_a}", f"output={base}", "train.epochs=1", "train.lr=3e-3") == 0
    assert run("finetune", *model, f"data.train={train_b}", f"init={base}", f"output={adapted}", "train.epochs=2",
               "train.lr=1e-2", "train.lora.rank=4", "train.lora.targets=[attention]") == 0
    sizes = [(run_dir / "best" / "model.safetensors").stat().st_size for run_dir in (adapted, base)]
    assert sizes[0] * 5 < sizes[1]  # adapters and the head only
    assert run("merge-lora", adapted, "--output", merged) == 0
    outputs = []
    for run_dir in (adapted, merged):
        out = tmp_path / f"{run_dir.name}.tsv"
        assert run("infer", "--model", run_dir, f"data.test={test}", "--output", out, "--probabilities") == 0
        outputs.append([line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()])
    a, b = outputs
    assert len(a) == 41 and [r[0] for r in a] == [r[0] for r in b]
    assert max(abs(float(p) - float(q)) for x, y in zip(a[1:], b[1:]) for p, q in zip(x[1:], y[1:])) < 1e-4
