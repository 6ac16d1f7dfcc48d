"""Early stopping, k-fold cross-validation and grid search through ``pentad finetune`` (tiny BERT, the
English fixture's sentences): what each writes, that a second run resumes instead of redoing work,
and that a bad grid fails before any run starts."""

from __future__ import annotations

import json

import pytest
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.training.trainer import MetricsLog


def _finetune(english, out, *extra: str) -> int:
    flags = [a for i, a in enumerate(extra) if a.startswith("--") or (i and extra[i - 1].startswith("--"))]
    overrides = [a for a in extra if a not in flags]
    return main(["finetune", "--task", "classification", *flags, "--config", "bert/tiny", *tiny(english["vocab"]),
                 f"data.train={english['train']}", f"output={out}", "train.threads=1", *overrides])


def test_early_stopping_stops_and_stays_stopped(english, tmp_path):
    out = tmp_path / "run"
    # a learning rate too small to change the dev score: no evaluation improves on the first one
    assert _finetune(english, out, f"data.dev={english['dev']}", "train.lr=1e-12", "train.epochs=5",
                     "train.eval_every=1", "train.early_stopping=2", "train.warmup=0") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["early_stopped_at"] == 3 and results["best_step"] == 1
    evaluated = [r["step"] for r in MetricsLog(out / "metrics.jsonl").read() if "dev_accuracy" in r]
    assert evaluated == [1, 2, 3]
    # run again: the run had stopped, so nothing trains
    assert _finetune(english, out, f"data.dev={english['dev']}", "train.lr=1e-12", "train.epochs=5",
                     "train.eval_every=1", "train.early_stopping=2", "train.warmup=0") == 0
    assert [r["step"] for r in MetricsLog(out / "metrics.jsonl").read() if "dev_accuracy" in r] == [1, 2, 3]
    assert json.loads((out / "results.json").read_text())["early_stopped_at"] == 3


def test_early_stopping_needs_a_dev_set(english, tmp_path, capsys):
    assert _finetune(english, tmp_path / "run", "train.early_stopping=2") == 2
    assert "train.early_stopping=2" in capsys.readouterr().err


def test_cross_validation_writes_folds_scores_and_out_of_fold_predictions(english, tmp_path):
    out = tmp_path / "cv"
    assert _finetune(english, out, "--folds", "3", f"data.test={english['test']}", "train.epochs=1") == 0
    cv = json.loads((out / "cv.json").read_text())
    assert cv["folds"] == 3 and cv["examples"] == 40
    assert [f["heldout_examples"] for f in cv["per_fold"]] == [14, 13, 13]
    assert all(f["train_examples"] + f["heldout_examples"] == 40 for f in cv["per_fold"])
    accuracies = [f["dev"]["accuracy"] for f in cv["per_fold"]]
    assert cv["dev_mean"]["accuracy"] == pytest.approx(sum(accuracies) / 3)
    assert set(cv["test_mean"]) == {"accuracy", "macro_f1"}
    # the held-out parts partition the training lines
    train_lines = english["train"].read_text().splitlines()[1:]
    held = [(out / "folds" / f"fold-{k}-heldout.tsv").read_text().splitlines()[1:] for k in (1, 2, 3)]
    assert sorted(sum(held, [])) == sorted(train_lines)
    for k in (1, 2, 3):
        kept = (out / "folds" / f"fold-{k}-train.tsv").read_text().splitlines()[1:]
        assert len(kept) + len(held[k - 1]) == 40
    # each training line's out-of-fold prediction is its fold model's, in the training file's order
    oof = (out / "oof_predictions.tsv").read_text().splitlines()
    assert oof[0] == "label\tprob_0\tprob_1" and len(oof) == 41
    position = {}
    for k in (1, 2, 3):  # the held-out file lists its lines in training order
        rows = (out / f"fold-{k}" / "oof_predictions.tsv").read_text().splitlines()[1:]
        assert len(rows) == len(held[k - 1])
        position.update({line: row for line, row in zip(held[k - 1], rows, strict=True)})
    # duplicate training lines share a fold-model prediction only by chance: compare by index instead
    from pentad.tasks.search import assign_folds

    parts = assign_folds(40, 3, 7)
    for k, indices in enumerate(parts, 1):
        rows = (out / f"fold-{k}" / "oof_predictions.tsv").read_text().splitlines()[1:]
        assert [oof[1 + i] for i in indices] == rows
    # a second run reuses the finished folds (their results are not rewritten)
    stamp = (out / "fold-2" / "results.json").stat().st_mtime_ns
    assert _finetune(english, out, "--folds", "3", f"data.test={english['test']}", "train.epochs=1") == 0
    assert (out / "fold-2" / "results.json").stat().st_mtime_ns == stamp
    # infer on the cross-validation directory names the folds
    assert main(["infer", "--model", str(out), f"data.test={english['test']}"]) == 2


def test_grid_search_picks_the_best_dev_score_and_infer_uses_it(english, tmp_path, capsys):
    out = tmp_path / "grid"
    assert _finetune(english, out, f"data.dev={english['dev']}", "--grid", "train.lr=1e-12,3e-3",
                     "--grid", "train.epochs=1,2") == 0
    grid = json.loads((out / "grid.json").read_text())
    assert grid["keys"] == ["train.lr", "train.epochs"] and len(grid["trials"]) == 4
    assert [t["values"] for t in grid["trials"]][1] == {"train.lr": 1e-12, "train.epochs": 2}
    best = max(grid["trials"], key=lambda t: t["selection"])
    assert grid["best"] == best["trial"]
    assert all(t["selection"] == t["dev"]["accuracy"] for t in grid["trials"])
    table = (out / "grid.tsv").read_text().splitlines()
    assert table[0].split("\t")[:4] == ["trial", "dir", "train.lr", "train.epochs"] and len(table) == 5
    trial_cfg = (out / "grid" / "trial-4" / "config.yaml").read_text()
    assert "lr: 0.003" in trial_cfg and "epochs: 2" in trial_cfg and "grid: null" in trial_cfg
    pred = tmp_path / "pred.tsv"
    assert main(["infer", "--model", str(out), f"data.test={english['test']}", "--output", str(pred)]) == 0
    assert len(pred.read_text().splitlines()) == 11
    assert f"using its best trial, {out / best['dir']}" in capsys.readouterr().err


def test_a_bad_grid_fails_before_any_run(english, tmp_path, capsys):
    out = tmp_path / "grid"
    assert _finetune(english, out, f"data.dev={english['dev']}", "--grid", "train.lr=1e-3,oops") == 2
    err = capsys.readouterr().err
    assert "trial 2" in err and "train.lr" in err
    assert not (out / "grid").exists()
    assert _finetune(english, out, "--grid", "train.lr=1e-3,1e-4") == 2  # no dev set to pick by
    assert "data.dev" in capsys.readouterr().err


def test_cross_validation_of_a_json_task_c3(tp, tmp_path):
    """Folds of C3 documents (JSON); the out-of-fold file holds every question of every document."""
    docs = json.loads((tp / "datasets" / "c3" / "dev.json").read_text(encoding="utf-8"))[:12]
    (tmp_path / "train.json").write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "cv"
    assert main(["finetune", "--task", "multiple_choice", "--folds", "2", "--config", "bert/tiny",
                 "tokenizer.type=wordpiece", f"tokenizer.vocab={tp / 'models' / 'google_zh_vocab.txt'}",
                 "model.hidden_size=32", "model.max_seq_length=64", "model.encoder.num_layers=1",
                 "model.encoder.num_heads=2", "model.encoder.ffn_size=64", "data.objective.seq_length=64",
                 f"data.train={tmp_path / 'train.json'}", f"output={out}", "train.epochs=1", "train.batch_size=8",
                 "train.progress=false", "train.threads=1"]) == 0
    cv = json.loads((out / "cv.json").read_text())
    assert [f["heldout_examples"] for f in cv["per_fold"]] == [6, 6] and 0 <= cv["dev_mean"]["accuracy"] <= 1
    ids = sorted(json.loads(line)["id"] for line in (out / "oof_predictions.jsonl").read_text().splitlines())
    assert ids == sorted(f"{doc[2]}-{n}" for doc in docs for n in range(len(doc[1])))
