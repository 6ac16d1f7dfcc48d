"""Multi-label classification through ``pentad finetune --task multi_label`` and ``pentad infer`` on real
sentences: which entity types (LOC, ORG, PER) a sentence of MSRA NER mentions, derived from its tags
(bench/downstream_tasks/multi_label.py). A tiny BERT from random weights beats the best constant label set,
measured on the same held-out sentences."""

from __future__ import annotations

import json

from tests.integration.bench_rows import bench_row

from pentad.cli.main import main


def test_multi_label_beats_the_best_constant_label_set(tp, tmp_path):
    row = bench_row("multi_label")
    msra = tp / "datasets" / "msra_ner"
    train = row.msra_multi_label(msra / "test.tsv", tmp_path / "train.tsv", rows=1200)
    dev = row.msra_multi_label(msra / "dev.tsv", tmp_path / "dev.tsv", rows=150)
    test = row.msra_multi_label(msra / "dev.tsv", tmp_path / "test.tsv", rows=300, start=150)
    assert "\n\t" in train.read_text(encoding="utf-8")  # sentences without entities: an empty label field
    out = tmp_path / "run"
    assert main(["finetune", "--task", "multi_label", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=64",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=128", f"data.train={train}", f"data.dev={dev}", f"data.test={test}",
                 f"output={out}", "train.epochs=8", "train.batch_size=16", "train.lr=3e-3",
                 "train.adam_bias_correction=true", "train.progress=false", "train.log_every=20",
                 "task.head_dropout=0", "task.pooling=mean"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["test"]) == {"micro_f1", "macro_f1", "subset_accuracy"}
    assert json.loads((out / "labels.json").read_text()) == {"kind": "string", "labels": ["LOC", "ORG", "PER"]}
    baseline, constant = row.best_constant(train, test)
    assert constant == ("LOC", "ORG", "PER")  # always all three
    assert results["test"]["micro_f1"] > baseline + 0.1, (results, baseline)  # measured 0.66 against 0.45

    sentences = [line.split("\t")[1] for line in test.read_text(encoding="utf-8").splitlines()[1:6]]
    (tmp_path / "in.tsv").write_text("text_a\n" + "\n".join(sentences) + "\n", encoding="utf-8")
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={tmp_path / 'in.tsv'}", "--output", str(pred),
                 "--probabilities"]) == 0
    lines = pred.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "label\tprob_LOC\tprob_ORG\tprob_PER" and len(lines) == 6
    for line in lines[1:]:
        labels, *probs = line.split("\t")
        chosen = {name for name, p in zip(("LOC", "ORG", "PER"), probs) if float(p) > 0.5}
        assert set(filter(None, labels.split(","))) == chosen
