"""Run directories: lock, interruption and resume, changed settings, best model, clean restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file
from tests.integration.conftest import tiny

from pentad.cli.main import main
from pentad.layout import checkpoint_steps
from pentad.training.trainer import MetricsLog

REPO = Path(__file__).resolve().parents[2]


def run(*argv) -> int:
    return main([str(a) for a in argv])


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in MetricsLog(run_dir / "metrics.jsonl").read() if "loss" in r]


@pytest.fixture(scope="module")
def dataset(bert_dataset) -> Path:
    return bert_dataset


def pretrain_args(english, dataset, output, *extra) -> list[str]:
    return ["pretrain", "--config", "bert/tiny", *tiny(english["vocab"]), f"data.dataset={dataset}",
            f"output={output}", "train.threads=1", *extra]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


# ---------------------------------------------------------------------------------------- lock
HOLD_LOCK = """
import os, sys, time
from pathlib import Path
from pentad.runs import RunLock
with RunLock(Path(sys.argv[1]), "pretrain"):
    child = os.fork()  # like a DataLoader worker, which outlives a killed parent for a few seconds
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    time.sleep(60)
"""


def test_second_process_is_refused_and_a_killed_holder_does_not_block(english, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())
    child = None
    try:
        child = int(holder.stdout.readline())
        assert run(*pretrain_args(english, dataset, out, "train.steps=2")) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid} on host {socket.gethostname()}" in err and "in use" in err
        assert "Traceback" not in err and not (out / "config.yaml").exists()
        holder.send_signal(signal.SIGKILL)  # a holder killed with -9 leaves the lock file behind
        holder.wait()
        assert (out / ".lock").is_file()
        os.kill(child, 0)  # its forked child still runs, and does not hold the lock
        assert run(*pretrain_args(english, dataset, out, "train.steps=2")) == 0
        assert len(losses(out)) == 2
    finally:
        holder.kill()
        if child is not None:
            os.kill(child, signal.SIGKILL)


# ------------------------------------------------------------------------------ interruption
def test_sigint_and_sigterm_save_and_resume_exactly(english, dataset, tmp_path, capsys):
    # long enough not to finish before the signal; both runs stop at the same step with stop_at
    common = ["train.steps=5000", "train.save_minutes=null"]
    split = tmp_path / "split"
    # Ctrl-C in a terminal: SIGINT to every process of the group, loader workers included
    proc = subprocess.Popen([sys.executable, "-m", "pentad", *pretrain_args(english, dataset, split, *common),
                             "data.loader_workers=2"],
                            stderr=subprocess.PIPE, text=True, env=subprocess_env(), start_new_session=True)
    deadline = time.monotonic() + 60
    while len(losses(split)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Run the same command again to resume" in err and "Traceback" not in err
    assert err.count("SIGINT: stopping after this step") == 1  # the workers leave it to the main process
    first = checkpoint_steps(split)[-1]
    assert first == len(losses(split)) >= 3

    # SIGTERM (what schedulers send) to this process, from another thread, in the resumed run
    finished = threading.Event()

    def terminate_later() -> None:
        limit = time.monotonic() + 60
        while len(losses(split)) < first + 3 and time.monotonic() < limit and not finished.is_set():
            time.sleep(0.01)
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    def ignore(signum, frame) -> None:  # should the signal come after the run, it must not end pytest
        pass

    previous = signal.signal(signal.SIGTERM, ignore)
    watcher = threading.Thread(target=terminate_later)
    watcher.start()
    try:
        rc = run(*pretrain_args(english, dataset, split, *common))
        assert signal.getsignal(signal.SIGTERM) is ignore  # the trainer put the handler back
    finally:
        finished.set()
        watcher.join()
        signal.signal(signal.SIGTERM, previous)
    assert rc == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err
    second = checkpoint_steps(split)[-1]
    assert second == len(losses(split)) >= first + 3

    target = second + 2
    assert run(*pretrain_args(english, dataset, split, *common, f"train.stop_at={target}")) == 0
    straight = tmp_path / "straight"
    assert run(*pretrain_args(english, dataset, straight, *common, f"train.stop_at={target}")) == 0
    assert len(losses(split)) == target and losses(split) == losses(straight)  # bitwise on CPU


def test_resume_from_an_earlier_checkpoint(english, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train.steps=6", "train.save_every=2", "train.keep_checkpoints=3"]
    assert run(*pretrain_args(english, dataset, out, *common)) == 0
    first = losses(out)
    assert checkpoint_steps(out) == [2, 4, 6]
    assert run(*pretrain_args(english, dataset, out, *common, "train.resume_from=3")) == 2
    assert "no checkpoint of step 3 (kept checkpoints: 2, 4, 6" in capsys.readouterr().err
    assert run(*pretrain_args(english, dataset, out, *common, "train.resume_from=2")) == 0
    assert "removed the later checkpoint of step 6" in capsys.readouterr().err
    assert losses(out) == first and checkpoint_steps(out) == [2, 4, 6]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["resume_from"] is None  # a one-off instruction, not recorded
    # a damaged latest checkpoint names the way back
    weights = out / "checkpoints" / "step-00000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    assert run(*pretrain_args(english, dataset, out, *common)) == 2
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err and "Kept checkpoints: 2, 4; resume from another with train.resume_from" in err
    assert run(*pretrain_args(english, dataset, out, *common, "train.resume_from=4")) == 0
    assert losses(out) == first


# --------------------------------------------------------------------------- changed settings
def test_changed_settings_are_refused_unless_allowed(english, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train.steps=6", "train.schedule=constant", "train.warmup=0"]
    assert run(*pretrain_args(english, dataset, out, *common, "train.stop_at=2")) == 0
    err = capsys.readouterr().err
    assert "stopped at step 2 of 6 (train.stop_at)" in err and "pre-training done" not in err
    changed = [*common, "train.lr=0.5", "train.batch_size=4"]
    assert run(*pretrain_args(english, dataset, out, *changed)) == 2
    err = capsys.readouterr().err
    assert "train.batch_size 8 -> 4" in err and "train.lr 0.001 -> 0.5" in err and "allow_changes" in err
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["lr"] == 0.001  # untouched
    # a longer run is a change too, with a hint on how to train a finished run further
    assert run(*pretrain_args(english, dataset, out, "train.steps=8", "train.schedule=constant",
                              "train.warmup=0")) == 2
    assert "train.steps 6 -> 8" in capsys.readouterr().err
    # keys that do not change the course of training may differ
    assert run(*pretrain_args(english, dataset, out, *common, "train.stop_at=3", "train.log_every=2",
                              "train.keep_checkpoints=1")) == 0
    assert run(*pretrain_args(english, dataset, out, *changed, "train.allow_changes=true")) == 0
    records = MetricsLog(out / "metrics.jsonl").read()
    change = [r for r in records if "config_changes" in r]
    assert change == [{"step": 3, "config_changes": {"train.batch_size": [8, 4], "train.lr": [0.001, 0.5]}}]
    assert [r["lr"] for r in records if "lr" in r] == [0.001, 0.001, 0.001, 0.5, 0.5, 0.5]  # the new lr is used
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["lr"] == 0.5


# ----------------------------------------------------------------------------- clean restarts
def test_restart_without_checkpoint_resets_metrics_and_removes_temporaries(english, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    (out / "checkpoints" / ".step-00000004.x1y2").mkdir(parents=True)  # an interrupted checkpoint write
    (out / "checkpoints" / ".step-00000004.x1y2" / "model.safetensors").write_bytes(b"half")
    (out / ".config.yaml.abc123").write_text("half")
    (out / ".gitignore").write_text("*\n")  # not pentad's: kept
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 9.0}) + "\n" for s in (1, 2, 3)))
    assert run(*pretrain_args(english, dataset, out, "train.steps=2")) == 0
    assert len(losses(out)) == 2 and 9.0 not in losses(out)
    assert not (out / "checkpoints" / ".step-00000004.x1y2").exists() and not (out / ".config.yaml.abc123").exists()
    assert (out / ".gitignore").is_file()
    assert "left by an interrupted earlier run" in capsys.readouterr().err
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert Path(saved["data"]["dataset"]).is_absolute() and Path(saved["tokenizer"]["vocab"]).is_absolute()


# ------------------------------------------------------------------------------- fine-tuning
def finetune_args(english, output, *extra) -> list[str]:
    return ["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(english["vocab"]),
            f"data.train={english['train']}", f"data.dev={english['dev']}", f"data.test={english['test']}",
            f"output={output}", "train.epochs=2", "train.eval_every=1", "train.threads=1", *extra]


def test_resumed_finetune_keeps_its_best_model(english, tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(*finetune_args(english, straight)) == 0
    assert run(*finetune_args(english, split, "train.stop_at=4")) == 0
    assert not (split / "results.json").exists()
    assert run(*finetune_args(english, split)) == 0
    a, b = (json.loads((d / "results.json").read_text()) for d in (straight, split))
    assert a["best_step"] == b["best_step"] and a["dev"] == b["dev"] and a["test"] == b["test"]
    best_a, best_b = (load_file(d / "best" / "model.safetensors") for d in (straight, split))
    assert best_a.keys() == best_b.keys() and all(best_a[k].equal(best_b[k]) for k in best_a)

    # a best model that no later step can beat survives a resume (its record is in the weights file)
    tampered = tmp_path / "tampered"
    assert run(*finetune_args(english, tampered, "train.stop_at=2")) == 0
    weights = tampered / "best" / "model.safetensors"
    record = {"step": 2, "score": 2.0, "metrics": {"accuracy": 2.0, "macro_f1": 2.0}}
    save_file(load_file(weights), weights, metadata={"format": "pt", "pentad_best": json.dumps(record)})
    capsys.readouterr()
    assert run(*finetune_args(english, tampered)) == 0
    assert "best model so far: step 2" in capsys.readouterr().err
    results = json.loads((tampered / "results.json").read_text())
    assert results["best_step"] == 2 and results["dev"] == record["metrics"]


def test_a_resumed_finetune_whose_best_model_is_missing_is_refused(english, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(*finetune_args(english, out, "train.epochs=1", "train.stop_at=2")) == 0
    (out / "best").rename(tmp_path / "kept")
    capsys.readouterr()
    assert run(*finetune_args(english, out, "train.epochs=1")) == 2
    err = capsys.readouterr().err
    assert "best/model.safetensors is missing, but this run evaluated at step(s) 1, 2 before the checkpoint it " \
           "resumes from (step 2)" in err and "--overwrite" in err
    assert not (out / "results.json").exists() and not (out / "best").exists()
    (tmp_path / "kept").rename(out / "best")
    assert run(*finetune_args(english, out, "train.epochs=1", "train.stop_at=3")) == 0
    assert "best model so far: step" in capsys.readouterr().err


def test_run_config_works_from_another_directory(english, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("train", "dev", "nolabel"):
        (work / f"{name}.tsv").write_bytes(english[name].read_bytes())
    (work / "vocab.txt").write_bytes(english["vocab"].read_bytes())
    monkeypatch.chdir(work)
    args = ["finetune", "--task", "classification", "--config", "bert/tiny", *tiny(Path("vocab.txt")),
            "data.train=train.tsv", "data.dev=dev.tsv", "output=ft", "train.epochs=1", "train.threads=1",
            "train.progress=true"]
    assert run(*args) == 0
    captured = capsys.readouterr()
    assert "evaluate dev:" in captured.err and "/10 " in captured.err  # the dev pass has a bar over 10 examples
    assert "step 5: dev accuracy" in captured.err and not captured.out
    saved = yaml.safe_load((work / "ft" / "config.yaml").read_text())
    assert saved["data"]["train"] == str(work / "train.tsv") and saved["output"] == str(work / "ft")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run("infer", "--model", work / "ft", f"data.test={work / 'nolabel.tsv'}", "--output", "pred.tsv") == 0
    err = capsys.readouterr().err
    assert "infer:" in err and "/10 " in err  # a progress bar over the 10 examples
    assert len((elsewhere / "pred.tsv").read_text().splitlines()) == 11


# ------------------------------------------------------------------------------- TensorBoard
class FakeWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (the tensorboard package is optional)."""

    made: list[FakeWriter] = []

    def __init__(self, log_dir: str, purge_step: int | None = None):
        self.log_dir, self.purge_step = log_dir, purge_step
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False
        FakeWriter.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_tensorboard_events_follow_metrics(english, dataset, tmp_path, monkeypatch, capsys):
    import types

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    FakeWriter.made.clear()
    out = tmp_path / "run"
    out.mkdir()
    (out / "events.out.tfevents.1.old").write_bytes(b"an abandoned attempt")
    assert run(*pretrain_args(english, dataset, out, "train.steps=3", "train.stop_at=2")) == 0
    assert not (out / "events.out.tfevents.1.old").exists()  # a run starting at step 0 starts a fresh log
    assert run(*pretrain_args(english, dataset, out, "train.steps=3")) == 0
    first, second = FakeWriter.made
    assert first.log_dir == str(out) and first.purge_step is None and second.purge_step == 2
    assert first.closed and second.closed
    assert [(s, v) for t, v, s in first.scalars + second.scalars if t == "train/loss"] == \
        [(r["step"], r["loss"]) for r in MetricsLog(out / "metrics.jsonl").read()]
    assert {t for t, _, _ in first.scalars} >= {"train/loss", "train/mlm_loss", "train/lr", "train/grad_norm"}

    # fine-tuning adds the dev metrics
    FakeWriter.made.clear()
    assert run(*finetune_args(english, tmp_path / "ft", "train.epochs=1")) == 0
    tags = {t for t, _, _ in FakeWriter.made[0].scalars}
    assert {"dev/accuracy", "dev/macro_f1", "train/loss"} <= tags

    # without the package: one line, and the run goes on; train.tensorboard=false: not even that
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    capsys.readouterr()
    assert run(*pretrain_args(english, dataset, tmp_path / "plain", "train.steps=2")) == 0
    assert capsys.readouterr().err.count("tensorboard package is not installed") == 1
    assert run(*pretrain_args(english, dataset, tmp_path / "off", "train.steps=2", "train.tensorboard=false")) == 0
    assert "tensorboard" not in capsys.readouterr().err.lower()


def test_tensorboard_reads_the_event_files(english, dataset, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run(*pretrain_args(english, dataset, out, "train.steps=3")) == 0
    events = EventAccumulator(str(out))
    events.Reload()
    records = MetricsLog(out / "metrics.jsonl").read()
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in records]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([r["loss"] for r in records])


def test_a_finished_run_without_its_latest_pointer_is_resumed_never_restarted(english, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(*finetune_args(english, out, "train.epochs=1", "train.save_every=2")) == 0
    def results() -> dict:
        found = json.loads((out / "results.json").read_text())
        found.pop("seconds")
        return found

    first = results()
    best = (out / "best" / "model.safetensors").read_bytes()
    metrics = (out / "metrics.jsonl").read_text()
    steps = checkpoint_steps(out)
    pointer = out / "checkpoints" / "latest"
    for damage in ("missing", "dangling"):
        if damage == "missing":
            pointer.unlink()
        else:
            pointer.write_text("step-00000099\n")
        capsys.readouterr()
        # a changed setting is still caught: the run is resumable, so its settings are checked
        assert run(*finetune_args(english, out, "train.epochs=1", "train.save_every=2", "train.lr=0.5")) == 2
        assert "train.lr 0.001 -> 0.5" in capsys.readouterr().err
        assert run(*finetune_args(english, out, "train.epochs=1", "train.save_every=2")) == 0
        err = capsys.readouterr().err
        assert "resuming from the newest complete checkpoint" in err and f"(step {steps[-1]})" in err
        assert (out / "best" / "model.safetensors").read_bytes() == best
        assert (out / "metrics.jsonl").read_text() == metrics
        assert results() == first
        assert pointer.read_text().strip() == f"step-{steps[-1]:08d}"  # repaired
    # no complete checkpoint left: refused, naming what is there and how to start afresh
    for step in steps:
        (out / "checkpoints" / f"step-{step:08d}" / "state.pt").unlink()
    pointer.write_text("step-00000099\n")
    assert run(*finetune_args(english, out, "train.epochs=1", "train.save_every=2")) == 2
    err = capsys.readouterr().err
    assert "holds an earlier run" in err and "best/" in err and "results.json" in err and "--overwrite" in err
    assert (out / "best" / "model.safetensors").read_bytes() == best and results() == first
    assert run(*finetune_args(english, out, "train.epochs=1", "train.save_every=2", "--overwrite")) == 0
    assert "removed the earlier run's checkpoints, best, results.json" in capsys.readouterr().err
    assert checkpoint_steps(out) == steps and (out / "results.json").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["overwrite"] is False  # a one-off instruction


def test_overwrite_reruns_the_finished_trials_of_a_grid_search(english, tmp_path, capsys):
    out = tmp_path / "grid"
    args = finetune_args(english, out, "train.epochs=1", "train.eval_every=5", "--grid", "train.lr=1e-3")
    assert run(*args) == 0
    capsys.readouterr()
    assert run(*args, "--overwrite") == 0
    err = capsys.readouterr().err
    assert "trial 1 of 1" in err and "removed the earlier run's checkpoints, best, results.json" in err
