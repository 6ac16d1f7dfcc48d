"""The qa row of ``bench/downstream.py`` without training: its train and dev files are disjoint whole
articles of CMRC 2018's dev set, and its baseline is the first-characters heuristic scored by the
task's metric."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the rows are the package bench.downstream_tasks


def test_qa_row_splits_articles_and_scores_its_baseline(shared_data, tmp_path):
    from bench.downstream_tasks.qa import first_characters_baseline, split_articles

    from pentad.tasks.qa import qa_metrics, read_squad

    train, dev = split_articles(shared_data / "datasets" / "cmrc2018" / "dev.json", tmp_path, 30, 20)
    articles = [json.loads(p.read_text(encoding="utf-8"))["data"] for p in (train, dev)]
    ids = [{a["id"] for a in part} for part in articles]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    counts = [sum(len(p["qas"]) for a in part for p in a["paragraphs"]) for part in articles]
    assert counts[0] >= 30 and counts[1] >= 20 and counts[0] - 30 < 10  # whole articles, rounded up
    questions, _ = read_squad(dev, with_labels=True)
    width = round(sum(q.end - q.start for q in read_squad(train, with_labels=True)[0]) / counts[0])
    expected = qa_metrics([q.answers for q in questions], [q.context[:width] for q in questions])["f1"]
    assert first_characters_baseline(train, dev) == pytest.approx(expected) and 0 < expected < 0.5
