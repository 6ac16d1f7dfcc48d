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
    # every path on gpt2; t5 without the compiled one (compiling is most of this test's time, and the compiled
    # encoder-decoder step is tests/unit/generation/test_static_cache.py's)
    module = _load()
    out, out_t5 = tmp_path / "results.json", tmp_path / "t5.json"
    assert module.main(["--preset", "tiny", "--models", "gpt2", "--new-tokens", "3", "--repeats", "1",
                        "--batch-sizes", "2", "--no-cache-batch-sizes", "2", "--json", str(out)]) == 0
    assert module.main(["--preset", "tiny", "--models", "t5", "--new-tokens", "3", "--repeats", "1",
                        "--batch-sizes", "2", "--no-cache-batch-sizes", "2", "--paths", "cache", "static", "no-cache",
                        "hf", "--json", str(out_t5)]) == 0
    (gpt2,) = json.loads(out.read_text())["results"]
    (t5,) = json.loads(out_t5.read_text())["results"]
    assert [(r["model"], r["batch"]) for r in (gpt2, t5)] == [("gpt2", 2), ("t5", 2)]
    for r in (gpt2, t5):
        assert r["same_tokens_as_hf"] and r["same_tokens_cache_vs_no_cache"] and r["same_tokens_static"]
        assert all(r[path]["tokens_per_s"] > 0 for path in ("cache", "static", "no-cache", "hf"))
        assert (r["device"], r["dtype"]) == ("cpu", "fp32")
    assert gpt2["same_tokens_compiled"] and gpt2["compiled"]["tokens_per_s"] > 0
    assert gpt2["compiled"]["first_call_s"] > 0 and gpt2["compiled"]["compile_s"] >= 0
    printed = capsys.readouterr().out
    assert "| gpt2 | 2 | 3 |" in printed and "| t5 | 2 | 3 |" in printed
    assert "| static / no-cache | compiled / no-cache |" in printed


def test_generation_benchmark_cache_rows(tmp_path, capsys) -> None:
    # the cache bytes per token of the latent (DeepSeek-V3-class) and grouped-query (Qwen3-class) rows
    module = _load()
    out = tmp_path / "results.json"
    assert module.main(["--preset", "tiny", "--models", "qwen3", "deepseek_v3", "--new-tokens", "3", "--repeats",
                        "1", "--batch-sizes", "1", "--paths", "cache", "hf", "--threads", "1",
                        "--json", str(out)]) == 0
    qwen3, deepseek = json.loads(out.read_text())["results"]
    assert qwen3["same_tokens_as_hf"] and deepseek["same_tokens_as_hf"]
    # qwen3 tiny: 2 layers x 2 key/value heads x 8 dims x (keys + values) x 4 bytes; full: 4 query heads
    assert qwen3["cache_bytes_per_token"] == {"pentad": 256.0, "hf": 256.0, "full_kv": 512.0}
    assert deepseek["cache_bytes_per_token"]["pentad"] == deepseek["cache_bytes_per_token"]["hf"]
    assert deepseek["cache_bytes_per_token"]["full_kv"] > deepseek["cache_bytes_per_token"]["pentad"]
    assert "| qwen3 | 1 | 256 | 256 | 512 | 2.0x |" in capsys.readouterr().out


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
