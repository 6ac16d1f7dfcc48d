"""Idiom cloze through ``pentad finetune --task chid`` and ``pentad infer``.

There is no ChID data beside the repository: a ChID-format set is made from real Chinese text
(TencentPretrain's sampled CLUECorpusSmall) by blanking out 4-character spans of passages, with
spans of other documents as the distracting candidates (``bench/downstream_tasks/chid.py``), in
ChID's layout (JSON lines + ``<name>_answer.json``).

Baselines measured on the same dev set: chance (1/candidates) and the candidate with the most
characters found in the passage. A tiny model trained from random weights for seconds does not
beat the second, so the test checks the pipeline, that the model fits its training blanks, and that
the dev score of results.json is the one the prediction file gives.
"""

from __future__ import annotations

import json

from bench.downstream_tasks.chid import make_cloze_set, overlap_baseline

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog

CANDIDATES = 7


def test_chid_finetunes_scores_and_predicts(tp, tmp_path):
    corpus = tp / "corpora" / "CLUECorpusSmall_sampled.txt"
    train, _ = make_cloze_set(corpus, tmp_path / "train.json", 60, candidates=CANDIDATES)
    dev, dev_answers = make_cloze_set(corpus, tmp_path / "dev.json", 40, offset=60, candidates=CANDIDATES, seed=1)
    run = tmp_path / "run"
    assert main(["finetune", "--task", "chid", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=32",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=64", "data.objective.seq_length=32", f"data.train={train}",
                 f"data.dev={dev}", f"output={run}", "train.epochs=15", "train.batch_size=8", "train.lr=3e-3",
                 "train.progress=false", "train.log_every=10", f"task.max_choices={CANDIDATES}",
                 "task.head_dropout=0.0", "model.embedding.dropout=0.0", "model.encoder.dropout=0.0"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert 0.0 <= results["dev"]["accuracy"] <= 1.0 and results["best_step"] > 0, results
    log = [r for r in MetricsLog(run / "metrics.jsonl").read() if "choice_accuracy" in r]
    fit = sum(r["choice_accuracy"] for r in log[-2:]) / 2
    assert fit >= 1 / CANDIDATES + 0.25, fit  # the training blanks are being fitted (measured: 0.49 vs 0.14)

    # the prediction file (the answer file's layout) gives the dev score of results.json
    pred = tmp_path / "dev_pred.json"
    assert main(["infer", "--model", str(run), f"data.test={dev}", "--output", str(pred)]) == 0
    predicted = json.loads(pred.read_text(encoding="utf-8"))
    gold = json.loads(dev_answers.read_text(encoding="utf-8"))
    assert list(predicted) == list(gold)
    assert sum(predicted[t] == gold[t] for t in gold) / len(gold) == results["dev"]["accuracy"]
    # the blanks of a line take different candidates (task.exclusive)
    for line in dev.read_text(encoding="utf-8").splitlines():
        tags = [t for passage in json.loads(line)["content"] for t in passage.split("#") if t.startswith("idiom")]
        chosen = [predicted[f"#{t}#"] for t in tags]
        assert len(set(chosen)) == len(chosen)

    pred = tmp_path / "dev_probs.json"
    assert main(["infer", "--model", str(run), f"data.test={dev}", "--output", str(pred), "--probabilities"]) == 0
    for value in json.loads(pred.read_text(encoding="utf-8")).values():
        assert 0 <= value["label"] < CANDIDATES and len(value["probabilities"]) == CANDIDATES
        assert abs(sum(value["probabilities"]) - 1) < 1e-4
    print(f"ChID-format dev ({len(gold)} blanks): pentad {results['dev']['accuracy']:.3f}, training fit {fit:.3f}; "
          f"baselines chance {1 / CANDIDATES:.3f}, passage overlap {overlap_baseline(dev, dev_answers):.3f}")
