"""bench/moe.py on a tiny size: the three models have the same active parameters (the router apart),
the MoE ones N/k times the feed-forward parameters, and every mode reports a throughput."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "moe.py"


def test_moe_bench_compares_equal_active_parameters():
    spec = importlib.util.spec_from_file_location("bench_moe", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(layers=1, hidden=16, heads=2, vocab=32, experts=4, top_k=2, expert_ffn=8, batch=2,
                              seq=8, reps=1, threads=1)
    results = bench.timed(args)
    dense, moe = results["dense"], results["moe"]
    assert moe["active"] - dense["active"] == args.experts * args.hidden * args.layers  # the router
    ffn = 3 * args.hidden * args.expert_ffn  # gate, up, down of one expert
    assert moe["params"] - moe["active"] == (args.experts - args.top_k) * ffn * args.layers
    for r in results.values():
        assert r["train_tokens_per_s"] > 0 and r["infer_tokens_per_s"] > 0
