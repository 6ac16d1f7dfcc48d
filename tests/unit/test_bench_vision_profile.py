"""``bench/vision_throughput.py --profile``: the operator table of pentad's and Hugging Face's ViT eval
forwards (one image, one forward each), which the inference comparison in bench/RESULTS.md rests on."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "vision_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("vision_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(rows: list[str], operator: str) -> list[str]:
    row = next(r for r in rows if r.startswith(f"| {operator} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_profile_counts_the_operators_of_both_forwards() -> None:
    rows = _bench().profile_rows(argparse.Namespace(size="tiny-16", batch_size=1, profile=1))
    assert rows[:2] == ["| operator | pentad ms (calls) | HF ms (calls) |", "|---|---:|---:|"]
    # pentad fuses query, key and value into one linear: 4 per layer + the head, against HF's 6 per layer + 1
    _, ours, hf = _cells(rows, "aten::addmm")
    assert ours.endswith("(49)") and hf.endswith("(73)")
    # both take SDPA's fused kernel (no mask for images), once per layer
    _, ours, hf = _cells(rows, "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert ours.endswith("(12)") and hf.endswith("(12)")
    _, ours, hf = _cells(rows, "all")
    assert float(ours) > 0 and float(hf) > 0
