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
    args = argparse.Namespace(size="tiny-16", layers=2, batch_size=1, profile=1, mode="infer", top=10)
    rows = _bench().profile_rows(args)
    assert rows[1:3] == ["| operator | pentad | pentad, last layer at CLS | HF |", "|---|---:|---:|---:|"]
    # (2 layers) pentad fuses query, key and value into one linear: 4 per layer + the head, against HF's 6 per
    # layer + 1;
    # with the last layer at CLS, that layer's fused projection is split into queries (the CLS row) and
    # keys/values (every row): one more
    _, ours, ours_cls, hf = _cells(rows, "aten::addmm")
    assert ours.endswith("(9)") and ours_cls.endswith("(10)") and hf.endswith("(13)")
    # all take SDPA's fused kernel (no mask for images), once per layer
    _, ours, ours_cls, hf = _cells(rows, "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert ours.endswith("(2)") and ours_cls.endswith("(2)") and hf.endswith("(2)")
    _, ours, ours_cls, hf = _cells(rows, "all")
    assert float(ours) > 0 and float(ours_cls) > 0 and float(hf) > 0


def test_training_profile_runs_the_backward_and_the_optimizer() -> None:
    args = argparse.Namespace(size="tiny-16", layers=2, batch_size=1, profile=1, mode="train", top=40)
    rows = _bench().profile_rows(args)
    assert rows[0].startswith("train step")
    _, ours, ours_cls, hf = _cells(rows, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert ours.endswith("(2)") and ours_cls.endswith("(2)") and hf.endswith("(2)")
    _, ours, ours_cls, hf = _cells(rows, "aten::_fused_adamw_")
    assert float(ours.split()[0]) > 0 and float(hf.split()[0]) > 0
