"""Smoke test of ``bench/generation_throughput.py`` at tiny sizes (seconds, not a timing test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "generation_throughput.py"


def test_generation_benchmark_runs_at_tiny_sizes(tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("generation_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "results.json"
    assert module.main(["--preset", "tiny", "--new-tokens", "3", "--repeats", "1", "--batch-sizes", "2",
                        "--no-cache-batch-sizes", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["model"], r["batch"]) for r in results] == [("gpt2", 2), ("t5", 2)]
    for r in results:
        assert r["same_tokens_as_hf"] and r["same_tokens_cache_vs_no_cache"]
        assert all(r[path]["tokens_per_s"] > 0 for path in ("cache", "no-cache", "hf"))
    assert "| gpt2 | 2 | 3 |" in capsys.readouterr().out
