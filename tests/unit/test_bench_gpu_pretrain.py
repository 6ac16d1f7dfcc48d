"""bench/gpu_pretrain.py at its tiny preset on a CPU: every side and precision yields a row with
tokens/s, MFU and the peak-memory field; TencentPretrain is skipped cleanly without a checkout (and
timed with one, when the environment variable PENTAD_TENCENTPRETRAIN names a checkout); the CLI mode
times ``pentad pretrain`` against the raw loop on a small generated corpus."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_pretrain.py"
PRECISIONS = ("tf32", "bf16", "bf16-true")


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu_pretrain", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def check_rows(result: dict, sides: tuple[str, ...], workloads: tuple[str, ...]) -> None:
    rows = result["results"]
    assert {(r["workload"], r["precision"], r["side"]) for r in rows} == {
        (w, p, s) for w in workloads for p in PRECISIONS for s in sides}
    for r in rows:
        assert {"tokens_per_s", "mfu", "mfu_datasheet", "peak_memory_gib", "model_flops_per_token"} <= set(r)
        if r["error"] is None:
            assert r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["first_loss"] > 0
            assert r["peak_memory_gib"] is None  # a CPU: the allocator's peak is a GPU's
            assert len(r["seconds"]) == 1
    env = result["env"]
    assert env["torch"] and env["transformers"] and env["device"] == "cpu"
    assert set(env["peak_tflops_measured"]) == {"tf32", "bf16"}
    assert all(v > 0 for v in env["peak_tflops_measured"].values())


def test_tiny_preset_every_side_and_precision(tmp_path):
    bench = load_bench()
    out = tmp_path / "out.json"
    result = bench.main(["--preset", "tiny", "--device", "cpu", "--workloads", "bert-128,llama-1b",
                         "--steps", "1", "--reps", "1", "--warmup", "1", "--matmul-size", "64",
                         "--json", str(out)])
    check_rows(result, bench.SIDES, ("bert-128", "llama-1b"))
    for r in result["results"]:
        if r["side"] == "tencentpretrain":
            assert r["error"].startswith("skipped") and r["tokens_per_s"] is None
        else:
            assert r["error"] is None
    for ratio in result["ratios"]:
        assert ratio["pentad_over_hf"] > 0 and ratio["pentad_over_tencentpretrain"] is None
    assert json.loads(out.read_text(encoding="utf-8"))["results"] == json.loads(json.dumps(result["results"]))


def test_tencentpretrain_side():
    checkout = os.environ.get("PENTAD_TENCENTPRETRAIN")
    if not checkout or not (Path(checkout) / "tencentpretrain" / "model_builder.py").is_file():
        pytest.skip("PENTAD_TENCENTPRETRAIN names no TencentPretrain checkout")
    pytest.importorskip("six")  # TencentPretrain imports it
    bench = load_bench()
    result = bench.main(["--preset", "tiny", "--device", "cpu", "--workloads", "bert-128,gpt2",
                         "--steps", "1", "--reps", "1", "--warmup", "1", "--matmul-size", "64",
                         "--tencentpretrain", checkout])
    check_rows(result, bench.SIDES, ("bert-128", "gpt2"))
    assert all(r["error"] is None for r in result["results"])
    assert all(r["pentad_over_tencentpretrain"] > 0 for r in result["ratios"])


def test_cli_against_raw_loop(tmp_path):
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "north", "green"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n", encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) for i in range(200)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bench = load_bench()
    result = bench.main(["--preset", "tiny", "--device", "cpu", "--cli-only", "--cli-precisions", "bf16",
                         "--steps", "2", "--reps", "2", "--warmup", "1", "--matmul-size", "64",
                         "--corpus", str(corpus), "--vocab", str(vocab), "--work", str(tmp_path / "work")])
    assert result["results"] == []
    (row,) = result["cli"]
    assert row["error"] is None, row["error"]
    assert len(row["cli_intervals_tokens_per_s"]) == 2  # 3 logged intervals, the first left out
    assert row["cli_tokens_per_s"] > 0 and row["raw_tokens_per_s"] > 0 and row["ratio"] > 0
    assert row["raw_mfu"] > 0 and row["cli_mfu"] > 0


def test_failing_side_is_recorded_and_the_others_go_on():
    bench = load_bench()
    calls = {"n": 0}

    def flaky(model, feed):  # the warm-up step works, the timed ones fail (as an out-of-memory would)
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return bench.hf_loss(model, feed)

    bench.LOSSES["hf"] = flaky
    result = bench.main(["--preset", "tiny", "--device", "cpu", "--workloads", "gpt2", "--precisions", "bf16",
                         "--sides", "pentad,hf", "--steps", "1", "--reps", "2", "--warmup", "1",
                         "--matmul-size", "64"])
    rows = {r["side"]: r for r in result["results"]}
    assert rows["hf"]["error"].startswith("RuntimeError: CUDA out of memory") and rows["hf"]["tokens_per_s"] is None
    assert rows["pentad"]["error"] is None and len(rows["pentad"]["seconds"]) == 2
    assert result["ratios"][0]["pentad_over_hf"] is None
