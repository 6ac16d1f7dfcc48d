"""A NaN or infinite loss or gradient norm in training (train.on_nonfinite): the step is never applied,
nothing non-finite is saved, and a diverged run exits non-zero."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.layout import checkpoint_steps
from pentad.training import trainer as trainer_module
from pentad.training.checkpoint import load_state
from pentad.training.trainer import MetricsLog


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def dataset(bert_dataset) -> Path:
    return bert_dataset


def pretrain_args(english, dataset, output, *extra) -> list[str]:
    return ["pretrain", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.dataset={dataset}",
            f"output={output}", "train.threads=1", "train.steps=6", "train.save_every=2", "train.warmup=0",
            "train.tensorboard=false", *extra]


def nan_at(monkeypatch, *steps: int) -> None:
    """Make the training loss NaN at these steps (one micro-batch per step): a fault injected into the
    loss the trainer sums, as a bad batch or an overflow would give."""
    calls = {"n": 0}
    real = trainer_module.total_loss

    def total_loss(outputs):
        calls["n"] += 1
        loss = real(outputs)
        return loss * float("nan") if calls["n"] in steps else loss

    monkeypatch.setattr(trainer_module, "total_loss", total_loss)


def finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(path).values())


def test_stop_leaves_the_step_out_exits_non_zero_and_keeps_the_last_checkpoint(english, dataset, tmp_path,
                                                                                 monkeypatch, capsys):
    out = tmp_path / "run"
    nan_at(monkeypatch, 3)
    assert run(*pretrain_args(english, dataset, out)) == 1
    err = capsys.readouterr().err
    assert "training diverged: the loss or gradient norm of step 3 was not finite" in err
    assert "train.on_nonfinite=stop" in err and "step-00000002, is intact" in err and "Traceback" not in err
    assert checkpoint_steps(out) == [2]  # nothing saved after it
    assert finite(out / "checkpoints" / "step-00000002" / "model.safetensors")
    records = MetricsLog(out / "metrics.jsonl").read()
    assert [r["step"] for r in records] == [1, 2, 3] and math.isnan(records[-1]["loss"])
    assert records[-1]["skipped_steps"] == 1 and "skipped_steps" not in records[0]


def test_skip_goes_on_without_the_step_and_a_long_run_of_them_stops(english, dataset, tmp_path, monkeypatch, capsys):
    out = tmp_path / "skip"
    nan_at(monkeypatch, 3)
    assert run(*pretrain_args(english, dataset, out, "train.on_nonfinite=skip")) == 0
    records = MetricsLog(out / "metrics.jsonl").read()
    assert [r.get("skipped_steps", 0) for r in records] == [0, 0, 1, 0, 0, 0]
    assert all(math.isfinite(r["loss"]) for r in records if r["step"] != 3)
    assert finite(out / "checkpoints" / "step-00000006" / "model.safetensors")
    # the skipped step moved no weight and is not counted by the optimizer: 5 of 6 steps applied
    steps = {float(s["step"]) for s in load_state(out / "checkpoints" / "step-00000006")["optimizer"]["state"].values()}
    assert steps == {5.0}

    limited = tmp_path / "limited"
    nan_at(monkeypatch, 3, 4, 5)
    assert run(*pretrain_args(english, dataset, limited, "train.on_nonfinite=skip", "train.max_skipped_steps=2")) == 1
    err = capsys.readouterr().err
    assert "3 steps in a row had a non-finite loss or gradient norm, more than train.max_skipped_steps=2" in err
    assert "first non-finite step was 3" in err
    # step 4's checkpoint holds step 2's weights (3 and 4 left out), finite; nothing after step 5's third skip
    assert checkpoint_steps(limited) == [2, 4]
    assert finite(limited / "checkpoints" / "step-00000004" / "model.safetensors")


def test_a_fine_tune_with_an_absurd_learning_rate_stops_and_never_keeps_a_non_finite_best(english, tmp_path, capsys):
    out = tmp_path / "finetune"
    assert run("finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
               f"data.train={english['train']}", f"data.dev={english['dev']}", f"output={out}", "train.epochs=2",
               "train.eval_every=1", "train.threads=1", "train.lr=1e30", "train.warmup=0",
               "train.tensorboard=false") == 1
    err = capsys.readouterr().err
    assert "training diverged" in err and "train.lr=1e+30" not in err and "Traceback" not in err
    assert not (out / "results.json").exists()
    best = out / "best" / "model.safetensors"
    assert not best.exists() or finite(best)
    for step in checkpoint_steps(out):
        assert finite(out / "checkpoints" / f"step-{step:08d}" / "model.safetensors")
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 1 if best.exists() else True
