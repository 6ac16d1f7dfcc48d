"""Regression through ``pentad finetune --task regression`` and ``pentad infer`` on real sentences: the
share of a sentence's characters inside named entities, derived from the tags of MSRA NER
(bench/downstream_tasks/regression.py). A tiny BERT from random weights, its best model picked by the
lowest dev mse, beats predicting the training mean on held-out sentences."""

from __future__ import annotations

import json

from tests.integration.bench_rows import bench_row

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog


def test_regression_beats_the_mean_and_keeps_the_lowest_mse(tp, tmp_path):
    row = bench_row("regression")
    msra = tp / "datasets" / "msra_ner"
    train = row.msra_entity_share(msra / "test.tsv", tmp_path / "train.tsv", rows=600)
    dev = row.msra_entity_share(msra / "dev.tsv", tmp_path / "dev.tsv", rows=150)
    test = row.msra_entity_share(msra / "dev.tsv", tmp_path / "test.tsv", rows=300, start=150)
    out = tmp_path / "run"
    assert main(["finetune", "--task", "regression", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=64",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=128", f"data.train={train}", f"data.dev={dev}", f"data.test={test}",
                 f"output={out}", "train.epochs=4", "train.batch_size=16", "train.lr=3e-3",
                 "train.adam_bias_correction=true", "train.progress=false", "train.log_every=20",
                 "task.head_dropout=0", "task.pooling=mean", "task.metric=mse"]) == 0
    results = json.loads((out / "results.json").read_text())
    state = json.loads((out / "labels.json").read_text())
    assert state["kind"] == "regression" and 0.05 < state["mean"] < 0.15 and 0.05 < state["std"] < 0.2
    # the best model is the one with the lowest dev mse (task.metric=mse), not the highest
    dev_mse = {r["step"]: r["dev_mse"] for r in MetricsLog(out / "metrics.jsonl").read() if "dev_mse" in r}
    assert len(dev_mse) == 4 and results["best_step"] == min(dev_mse, key=dev_mse.get)
    baseline = row.mean_baseline_mse(train, test)
    assert results["test"]["mse"] < 0.75 * baseline, (results, baseline)  # measured 0.0088 against 0.0187
    assert results["test"]["pearson"] > 0.5 and results["test"]["spearman"] > 0.5, results
    # pentad evaluate scores the test file as fine-tuning did (the best model, the task's own metrics)
    scores = tmp_path / "test_scores.json"
    assert main(["evaluate", "--model", str(out), f"data.test={test}", "--output", str(scores)]) == 0
    assert json.loads(scores.read_text(encoding="utf-8")) == results["test"]

    sentences = [line.split("\t")[1] for line in test.read_text(encoding="utf-8").splitlines()[1:6]]
    (tmp_path / "in.tsv").write_text("text_a\n" + "\n".join(sentences) + "\n", encoding="utf-8")
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={tmp_path / 'in.tsv'}", "--output", str(pred)]) == 0
    lines = pred.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "label" and len(lines) == 6
    assert all(-0.5 < float(v) < 1.5 for v in lines[1:])  # on the labels' scale (shares), not standardised
