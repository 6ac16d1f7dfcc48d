"""``bench/downstream.py`` without running the rows: every row module keeps the row contract, the
table reads right, and a failing row is reported beside the others."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "downstream.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_downstream", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_row_has_run_with_the_contract_signature(bench):
    names = bench.row_names()
    assert {"classification", "ner"} <= set(names)
    for name in names:
        module = importlib.import_module(f"bench.downstream_tasks.{name}")
        assert list(inspect.signature(module.run).parameters) == ["out_dir", "shared", "quick"], name
        assert module.__doc__, f"row {name} has no docstring"


def test_table_lists_scores_baselines_and_failures(bench):
    rows = [{"task": "ner", "dataset": "msra_ner (dev)", "metric": "f1", "score": 0.61234, "baseline_name": "all 'O'",
             "baseline": 0.0, "seconds": 12.4, "train_examples": 1000},
            {"row": "qa", "error": "ValueError: boom"}]
    text = bench.table(rows).splitlines()
    assert text[2] == "| ner | msra_ner (dev) | f1 | 0.612 | 0.000 (all 'O') | 1,000 | 12 |"
    assert "failed: ValueError: boom" in text[3]


def test_a_failing_row_does_not_hide_the_others(bench, monkeypatch, tmp_path, capsys):
    import types

    good = types.SimpleNamespace(run=lambda out_dir, shared, quick: {
        "task": "t", "dataset": "d", "metric": "m", "score": 1.0, "baseline_name": "b", "baseline": 0.5,
        "seconds": 1.0, "train_examples": 3})
    bad = types.SimpleNamespace(run=lambda out_dir, shared, quick: {"task": "t"})
    monkeypatch.setattr(bench, "row_names", lambda: ["bad", "good"])
    monkeypatch.setattr(bench.importlib, "import_module",
                        lambda name: {"bench.downstream_tasks.bad": bad, "bench.downstream_tasks.good": good}[name])
    monkeypatch.setattr(bench, "SHARED", tmp_path)
    monkeypatch.setattr(sys, "argv", ["downstream.py", "--quick", "--output", str(tmp_path / "o")])
    assert bench.main() == 1
    out = capsys.readouterr().out
    assert "failed: ValueError: row bad did not report" in out and "| t | d | m | 1.000 | 0.500 (b) | 3 | 1 |" in out
