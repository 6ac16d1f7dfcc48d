"""Answer ranking through ``pentad finetune --task ranking`` and ``pentad infer`` on real data: CMRC 2018
questions against each sentence of their passage, a sentence correct when it contains the answer
(bench/downstream_tasks/ranking.py). A tiny cross-encoder from random weights ranks held-out questions'
sentences better than chance (the exact expected MRR of a random order, computed on the same questions).
A lexical-overlap ranker, measured beside it, shows what the data allows: a model this small and this
briefly trained from random weights is far below it (bench/downstream_tasks/ranking.py compares with a
pre-trained model)."""

from __future__ import annotations

import json
from math import comb

import numpy as np
from tests.integration.bench_rows import bench_row

from pentad.cli.main import main
from pentad.tasks.ranking import question_groups, ranking_metrics


def random_order_mrr(labels: np.ndarray, qids: list[str]) -> float:
    """The expected MRR of ranking each question's n candidates (k correct) in a uniformly random order:
    the best correct candidate is at rank r with probability C(n - r, k - 1) / C(n, k)."""
    values = []
    for rows in question_groups(qids):
        n, k = len(rows), int(labels[rows].sum())
        if k:
            values.append(sum(comb(n - r, k - 1) / comb(n, k) / r for r in range(1, n - k + 2)))
    return float(np.mean(values))


def test_ranking_beats_a_random_order(tp, tmp_path):
    row = bench_row("ranking")
    cmrc = tp / "datasets" / "cmrc2018" / "dev.json"
    train = row.cmrc_ranking(cmrc, tmp_path / "train.tsv", first=0, count=25)
    dev = row.cmrc_ranking(cmrc, tmp_path / "dev.tsv", first=700, count=10)
    test = row.cmrc_ranking(cmrc, tmp_path / "test.tsv", first=720, count=12)
    out = tmp_path / "run"
    assert main(["finetune", "--task", "ranking", "--config", "bert/tiny", "tokenizer.type=wordpiece",
                 f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}", "model.hidden_size=64",
                 "model.max_seq_length=64", "model.encoder.num_layers=1", "model.encoder.num_heads=2",
                 "model.encoder.ffn_size=128", f"data.train={train}", f"data.dev={dev}", f"data.test={test}",
                 f"output={out}", "train.epochs=5", "train.batch_size=32", "train.lr=2e-3",
                 "train.adam_bias_correction=true", "train.progress=false", "train.log_every=20",
                 "task.head_dropout=0"]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [line.split("\t") for line in test.read_text(encoding="utf-8").splitlines()[1:]]
    labels, qids = np.array([int(r[0]) for r in rows]), [r[1] for r in rows]
    chance = random_order_mrr(labels, qids)
    overlap = ranking_metrics(np.array(row.overlap_scores(test)), labels, qids)["mrr"]
    assert results["test"]["mrr"] > chance + 0.05, (results, chance)  # measured 0.45 against 0.30
    assert results["test"]["map"] > chance - 0.05, (results, chance)
    assert overlap > chance + 0.3, (overlap, chance)  # the data carries the signal (0.83 measured)

    (tmp_path / "in.tsv").write_text("qid\ttext_a\ttext_b\n" + "".join(
        "\t".join(r[1:]) + "\n" for r in rows[:12]), encoding="utf-8")
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={tmp_path / 'in.tsv'}", "--output", str(pred)]) == 0
    lines = [line.split("\t") for line in pred.read_text(encoding="utf-8").splitlines()]
    assert lines[0] == ["qid", "score", "rank"] and [q for q, _, _ in lines[1:]] == qids[:12]
    for group in question_groups(qids[:12]):
        ranks = sorted(int(lines[1 + i][2]) for i in group)
        assert ranks == list(range(1, len(group) + 1))
        best = min(group, key=lambda i: int(lines[1 + i][2]))
        assert float(lines[1 + best][1]) == max(float(lines[1 + i][1]) for i in group)
