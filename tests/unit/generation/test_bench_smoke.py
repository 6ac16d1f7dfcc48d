"""Smoke test of ``bench/generation_throughput.py`` at tiny sizes (seconds, not a timing test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "generation_throughput.py"


def _load():
    spec = importlib.util.spec_from_file_location("generation_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generation_benchmark_runs_at_tiny_sizes(tmp_path, capsys) -> None:
    module = _load()
    out = tmp_path / "results.json"
    assert module.main(["--preset", "tiny", "--new-tokens", "3", "--repeats", "1", "--batch-sizes", "2",
                        "--no-cache-batch-sizes", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["model"], r["batch"]) for r in results] == [("gpt2", 2), ("t5", 2)]
    for r in results:
        assert r["same_tokens_as_hf"] and r["same_tokens_cache_vs_no_cache"]
        assert r["same_tokens_static"] and r["same_tokens_compiled"]
        assert all(r[path]["tokens_per_s"] > 0 for path in ("cache", "static", "compiled", "no-cache", "hf"))
        compiled = r["compiled"]
        assert compiled["first_call_s"] > 0 and compiled["compile_s"] >= 0
        assert (r["device"], r["dtype"]) == ("cpu", "fp32")
    printed = capsys.readouterr().out
    assert "| gpt2 | 2 | 3 |" in printed
    assert "| static / no-cache | compiled / no-cache |" in printed


def test_generation_benchmark_chosen_paths(tmp_path, capsys) -> None:
    module = _load()
    out = tmp_path / "results.json"
    assert module.main(["--preset", "tiny", "--models", "gpt2", "--new-tokens", "3", "--repeats", "1",
                        "--batch-sizes", "1", "--paths", "static", "cache", "--dtype", "bf16",
                        "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert {"cache", "static"} <= set(r) and not {"compiled", "no-cache", "hf"} & set(r)
    assert "same_tokens_as_hf" not in r and "same_tokens_compiled" not in r
    assert isinstance(r["same_tokens_static"], bool) and r["dtype"] == "bf16"
    assert "| gpt2 | 1 | 3 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        module.main(["--preset", "tiny", "--paths", "fast"])
