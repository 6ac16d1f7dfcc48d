"""bench/cpu_kernels.py on a tiny vocabulary: every row times both sides and reports a ratio."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_kernels.py"


def test_cpu_kernels_bench_reports_every_row(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_cpu_kernels", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["cpu_kernels.py", "--threads", "1", "--repeats", "1", "--rows", "64",
                                      "--vocab", "300", "--json", str(out)])
    assert bench.main() == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["kernel"] for r in rows] == ["dropout p=0.1"] * 4 + ["linear + cross-entropy"] * 3
    assert {r["dtype"] for r in rows[4:]} == {"fp32", "bf16 autocast", "bf16 weights"}
    assert all(r["torch_ms"] > 0 and r["pentad_ms"] > 0 and r["ratio"] > 0 for r in rows)
