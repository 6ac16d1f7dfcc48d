"""The demo's plan, its few-label draws and its standard errors (the demo itself: tests/integration)."""

from __future__ import annotations

import math

import pytest

from pentad import demo

SECONDS = {"pretrain": 0.2, "small16": 0.05, "small32": 0.08, "reference16": 0.2, "reference32": 0.35}


def test_standard_error_of_draws_and_of_one_run():
    assert demo.standard_error([0.6, 0.7, 0.8], 1000) == pytest.approx(0.1 / math.sqrt(3))
    assert demo.standard_error([0.75], 1000) == pytest.approx(math.sqrt(0.75 * 0.25 / 1000))


def test_paired_gain_cancels_what_both_models_share():
    import numpy as np

    rng = np.random.default_rng(1)
    base = (rng.random((3, 1000)) < 0.7).astype(float)
    other = base.copy()
    flip = rng.choice(1000, 40, replace=False)  # other gets 40 more of each run's examples right
    other[:, flip] = 1.0
    gain, shift_se = demo.paired_gain(base, other)
    assert gain == pytest.approx((other - base).mean())
    assert 0 < shift_se < 0.01  # far below the binomial error of one accuracy (0.014): the shared errors cancel
    assert demo.paired_gain(base, base) == (0.0, 0.0)
    # independent models of equal accuracy: near the error of the mean of 3,000 independent differences (0.012;
    # the spread between three runs is itself estimated from three numbers)
    noisy = (rng.random((3, 1000)) < 0.7).astype(float)
    gain, se = demo.paired_gain(base, noisy)
    assert abs(gain) < 3 * se and 0.011 < se < 0.025
    # one run: the paired error over the examples
    assert demo.paired_gain(base[:1], noisy[:1])[1] == pytest.approx((noisy[0] - base[0]).std(ddof=1) / math.sqrt(1000))
    # simulated many times, the error matches the spread of the gain (runs whose gains differ, shared examples)
    gains, errors = [], []
    for trial in range(300):
        sim = np.random.default_rng(100 + trial)
        truth = sim.random(400) < 0.7  # what the base model gets right, per example
        run_shift = sim.normal(0, 0.03, size=(4, 1))  # each run's own gain
        b = (sim.random((4, 400)) < np.where(truth, 0.9, 0.2)).astype(float)
        o = (sim.random((4, 400)) < np.clip(np.where(truth, 0.92, 0.25) + run_shift, 0, 1)).astype(float)
        g, e = demo.paired_gain(b, o)
        gains.append(g)
        errors.append(e)
    assert float(np.mean(errors)) == pytest.approx(float(np.std(gains)), rel=0.2)
    # the spread between runs counts: runs that disagree on the gain widen its error
    spread = base.copy()
    spread[0, flip] = 1.0
    spread[1, :] = base[1]
    spread[2, rng.choice(1000, 120, replace=False)] = 1.0
    assert demo.paired_gain(base, spread)[1] > shift_se


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
    # every seed of the small models' whole-training-set fine-tunes is paid for
    one_seed = demo.make_plan(450, 30, SECONDS, n_train=8453, n_eval=1056, full_seeds=1)
    assert one_seed.estimate["full fine-tunes"] * demo.FULL_SEEDS == pytest.approx(plan.estimate["full fine-tunes"])


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
