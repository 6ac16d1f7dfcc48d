"""``train.adversarial`` through ``pentad finetune`` on real reviews (book_review): FGM and PGD train a tiny
classifier (in bf16 weights, and under bf16 autocast), log the adversarial loss beside the clean one, and
write results; the perturbed loss is the larger (the step goes up the gradient)."""

from __future__ import annotations

import json
from statistics import mean

import pytest
from tests.integration.bench_rows import bench_row
from tests.integration.conftest import tiny

from pentad.cli.main import main


@pytest.mark.parametrize("method,precision", [("fgm", "bf16-true"), ("pgd", "bf16")])
def test_adversarial_finetune_trains_and_writes_results(tp, tmp_path, method, precision):
    common = bench_row("common")
    book = tp / "datasets" / "book_review"
    train = common.head_tsv(book / "train.tsv", tmp_path / "train.tsv", 240)
    dev = common.head_tsv(book / "dev.tsv", tmp_path / "dev.tsv", 60)
    out = tmp_path / "run"
    assert main(["finetune", "--task", "classification", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=32",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=64", f"data.train={train}", f"data.dev={dev}", f"data.test={dev}",
                 f"output={out}", "train.epochs=2", "train.batch_size=16", "train.lr=1e-3", "train.progress=false",
                 "train.log_every=3", "task.head_dropout=0", "model.encoder.dropout=0", "model.embedding.dropout=0",
                 f"train.precision={precision}", f"train.adversarial.method={method}",
                 "train.adversarial.epsilon=0.5", "train.adversarial.steps=2"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert 0.0 <= results["test"]["accuracy"] <= 1.0 and results["best_step"] >= 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "loss" in r]
    assert trained and all("adv_loss" in r for r in trained)
    assert mean(r["adv_loss"] for r in trained) > mean(r["loss"] for r in trained)


def test_an_interrupted_adversarial_distilled_run_resumes_to_the_same_losses(english, tmp_path):
    # PGD draws dropout in every extra forward, and the teacher runs on every micro-batch: stopped after 3
    # steps and resumed, the run logs the losses of the run that never stopped
    data = [*tiny(english["vocab"]), f"data.train={english['train']}", "train.epochs=2", "train.tensorboard=false"]
    teacher, straight, split = tmp_path / "teacher", tmp_path / "straight", tmp_path / "split"

    def finetune(*overrides: str, teacher_run=None) -> int:
        flags = ["--teacher", str(teacher_run)] if teacher_run else []
        return main(["finetune", "--task", "classification", *flags, "--config", "bert/tiny", *data, *overrides])

    assert finetune(f"output={teacher}", "train.epochs=1") == 0
    options = ["train.adversarial.method=pgd", "train.adversarial.steps=2"]
    assert finetune(*options, f"output={straight}", teacher_run=teacher) == 0
    assert finetune(*options, f"output={split}", "train.stop_at=3", teacher_run=teacher) == 0
    assert finetune(*options, f"output={split}", teacher_run=teacher) == 0

    def logged(run):
        return [(r["loss"], r["adv_loss"], r["cls_distill_loss"])
                for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    assert len(logged(straight)) > 3 and logged(split) == logged(straight)
