"""The demo's plan, its few-label draws and its standard errors (the demo itself: tests/integration)."""

from __future__ import annotations

import math

import pytest

from pentad import demo

SECONDS = {"pretrain": 0.2, "small16": 0.05, "small32": 0.08, "reference16": 0.2, "reference32": 0.35}


def test_standard_error_of_draws_and_of_one_run():
    assert demo.standard_error([0.6, 0.7, 0.8], 1000) == pytest.approx(0.1 / math.sqrt(3))
    assert demo.standard_error([0.75], 1000) == pytest.approx(math.sqrt(0.75 * 0.25 / 1000))


def test_plan_gives_pretraining_what_the_fine_tunes_leave():
    plan = demo.make_plan(450, 30, SECONDS, n_train=8453, n_eval=1056)
    fine_tunes = plan.estimate["few-label fine-tunes"] + plan.estimate["full fine-tunes"]
    assert plan.pretrain_steps == int((450 - 30 - fine_tunes - 15) / SECONDS["pretrain"])
    assert 30 + sum(plan.estimate.values()) <= 450
    slower = demo.make_plan(450, 30, {k: 1.5 * v for k, v in SECONDS.items()}, n_train=8453, n_eval=1056)
    assert slower.pretrain_steps < plan.pretrain_steps  # a slower machine pre-trains less, not longer
    # No budget left: a floor of steps, so that "pre-trained" still means something.
    assert demo.make_plan(60, 30, SECONDS, 8453, 1056).pretrain_steps == demo.MIN_PRETRAIN_STEPS
    assert demo.make_plan(450, 30, SECONDS, 512, 256, quick=True).pretrain_steps == 30
    # the reference on the whole training set costs its steps, taken from pre-training
    full = demo.make_plan(450, 30, SECONDS, n_train=8453, n_eval=1056, reference_full=True)
    extra = math.ceil(8453 / 32) * SECONDS["reference32"]
    assert full.estimate["full fine-tunes"] > plan.estimate["full fine-tunes"] + extra
    assert full.pretrain_steps < plan.pretrain_steps


def test_few_label_draws_are_balanced_seeded_and_different(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("label\ttext_a\n" + "".join(f"{i % 2}\tsentence {i}\n" for i in range(200)), encoding="utf-8")
    first = demo._few_label_sets(train, tmp_path / "a", 20, 3)
    again = demo._few_label_sets(train, tmp_path / "b", 20, 3)
    rows = [path.read_text(encoding="utf-8").splitlines() for path in first]
    assert all(r[0] == "label\ttext_a" and len(r) == 21 for r in rows)
    assert all(sum(line.startswith("1\t") for line in r[1:]) == 10 for r in rows)
    assert [p.read_text() for p in first] == [p.read_text() for p in again]
    assert len({tuple(sorted(r[1:])) for r in rows}) == 3


def test_unigram_entropy_of_a_dataset_leaves_special_tokens_out(tmp_path):
    import json

    import numpy as np

    tokens = np.array([0, 5, 5, 6, 6, 1, 0, 7, 7, 7, 7, 1], dtype="<u2")  # 0/1: special
    tokens.tofile(tmp_path / "shard.tokens.bin")
    manifest = {"token_dtype": "<u2", "shards": [{"tokens": "shard.tokens.bin"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    p = np.array([2, 2, 4]) / 8
    assert demo.unigram_entropy(tmp_path, {0, 1}) == pytest.approx(float(-(p * np.log(p)).sum()))
