"""Multiple choice through ``pentad finetune --task multiple_choice`` and ``pentad infer`` on real C3
data (TencentPretrain's datasets/c3; its dev set is the only labelled split here, so slices of it
train and evaluate): a tiny randomly initialised BERT with Google's Chinese vocabulary.

Baselines measured here on the same dev slice: chance (the mean of 1/choices), the longest choice,
and the choice with the most characters found in the context. A tiny model trained for seconds
from random weights does not beat them (C3 needs a pre-trained model), so the test checks what such
a run can show: the whole pipeline, that the model fits its training questions (the labels reach
the right choices through the padded, flattened batches), and that the dev score in results.json
is the one the prediction file gives.
"""

from __future__ import annotations

import json

from bench.downstream_tasks.c3 import baselines

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

TRAIN_DOCS, DEV_DOCS, TEST_DOCS = 96, 60, 8


def test_c3_finetunes_scores_and_predicts(tp, tmp_path):
    dev_all = json.loads((tp / "datasets" / "c3" / "dev.json").read_text(encoding="utf-8"))
    test_all = json.loads((tp / "datasets" / "c3" / "test.json").read_text(encoding="utf-8"))
    splits = {"train": dev_all[:TRAIN_DOCS], "dev": dev_all[TRAIN_DOCS:TRAIN_DOCS + DEV_DOCS],
              "test": test_all[:TEST_DOCS]}
    for name, docs in splits.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
    run = tmp_path / "run"
    assert main(["finetune", "--task", "multiple_choice", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=32",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=64", "data.objective.seq_length=64",
                 f"data.train={tmp_path / 'train.json'}", f"data.dev={tmp_path / 'dev.json'}",
                 f"output={run}", "train.epochs=12", "train.batch_size=8", "train.lr=3e-3", "train.progress=false",
                 "train.log_every=20", "task.head_dropout=0.0", "model.embedding.dropout=0.0",
                 "model.encoder.dropout=0.0"]) == 0
    results = json.loads((run / "results.json").read_text())
    base = baselines(splits["dev"])
    assert 0.0 <= results["dev"]["accuracy"] <= 1.0 and results["best_step"] > 0, results
    # the model fits its training questions well beyond chance over the last 40 steps (measured: 0.98 vs 0.27)
    log = [r for r in MetricsLog(run / "metrics.jsonl").read() if "choice_accuracy" in r]
    fit = sum(r["choice_accuracy"] for r in log[-2:]) / 2
    train_chance = baselines(splits["train"])["chance"]
    assert fit >= train_chance + 0.3, (fit, train_chance)

    # infer on the dev slice: the file's answers give the dev score of results.json (best model reloaded)
    pred = tmp_path / "dev_pred.jsonl"
    assert main(["infer", "--model", str(run), f"data.test={tmp_path / 'dev.json'}", "--output", str(pred)]) == 0
    records = [json.loads(line) for line in pred.read_text(encoding="utf-8").splitlines()]
    questions = [(f"{doc[2]}-{n}", q) for doc in splits["dev"] for n, q in enumerate(doc[1])]
    assert [r["id"] for r in records] == [qid for qid, _ in questions]
    right = sum(r["answer"] == q["answer"] and q["choice"][r["label"]] == r["answer"]
                for r, (_, q) in zip(records, questions))
    assert right / len(questions) == results["dev"]["accuracy"], (right, results, base)

    # infer on unlabelled test documents (C3's own test.json layout: question ids, no answers)
    pred = tmp_path / "test_pred.jsonl"
    assert main(["infer", "--model", str(run), f"data.test={tmp_path / 'test.json'}", "--output", str(pred),
                 "--probabilities"]) == 0
    records = [json.loads(line) for line in pred.read_text(encoding="utf-8").splitlines()]
    questions = [q for doc in splits["test"] for q in doc[1]]
    assert [r["id"] for r in records] == [q["id"] for q in questions]
    for r, q in zip(records, questions):
        assert 0 <= r["label"] < len(q["choice"]) and r["answer"] == q["choice"][r["label"]]
        assert len(r["probabilities"]) == len(q["choice"]) and abs(sum(r["probabilities"]) - 1) < 1e-4
        assert max(r["probabilities"]) == r["probabilities"][r["label"]]
    print(f"C3 dev: pentad {results['dev']['accuracy']:.3f}, training fit {fit:.3f}; baselines "
          + ", ".join(f"{k} {v:.3f}" for k, v in base.items()))
