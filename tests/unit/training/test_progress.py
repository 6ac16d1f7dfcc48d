"""What the training loop shows while it runs: plain progress lines at a bounded rate when stderr is not
a terminal (a fake clock, no waiting), the tqdm bar on a terminal, and the one-line estimate of the run's
time from a few timed steps after the first."""

from __future__ import annotations

import io
import re

import torch
from tests.conftest import tiny_model_dict

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.training.config import TrainConfig
from pentad.training.progress import (
    ProgressBar,
    ProgressLines,
    RunEstimate,
    about,
    format_duration,
    format_line,
    make_progress,
)
from pentad.training.trainer import Trainer


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_durations_read_at_a_glance():
    assert [format_duration(s) for s in (0, 42.4, 60, 381, 3599, 7500)] == \
        ["0s", "42s", "1m00s", "6m21s", "59m59s", "2h05m"]
    assert [about(s) for s in (0.2, 40, 61, 12.4 * 60, 89 * 60, 3.5 * 3600)] == \
        ["1 s", "40 s", "1 min", "12 min", "89 min", "3.5 h"]


def test_a_line_gives_step_percent_loss_speed_and_eta():
    line = format_line("pretrain", 120, 1000, loss=3.45121, steps_per_s=2.0, samples_per_step=32,
                       tokens_per_s=18234.0, elapsed=52)
    assert line == ("pretrain step 120/1,000 (12%) | loss 3.4512 | 2 steps/s, 64 samples/s, 18.2k tokens/s"
                    " | elapsed 52s, ETA 7m20s")
    slow = format_line("finetune", 1, 10, loss=None, steps_per_s=0.25, elapsed=4)
    assert slow == "finetune step 1/10 (10%) | loss - | 4 s/step | elapsed 4s, ETA 36s"
    fast = format_line("x", 1, 10**6, loss=None, steps_per_s=1234.5, samples_per_step=4, tokens_per_s=5360.0)
    assert "| 1234 steps/s, 4.94k samples/s, 5.36k tokens/s |" in fast  # no exponent notation
    assert "| 999 steps/s, 4k samples/s, 1.31M tokens/s |" in format_line(
        "x", 1, 10**6, loss=None, steps_per_s=999.0, samples_per_step=4, tokens_per_s=1.31e6)
    assert format_line("x", 3, 10, loss=1.0, steps_per_s=None).endswith("| loss 1.0000 | elapsed 0s, ETA -")
    assert format_line("x", 10, 10, loss=1.0, steps_per_s=1.0, elapsed=75, done=True).endswith("| done in 1m15s")
    assert format_line("x", 4, 10, loss=1.0, steps_per_s=1.0, elapsed=5, done=True).endswith("| stopped after 5s")


def test_lines_come_after_the_first_step_then_at_most_every_n_seconds_and_at_the_end():
    clock, out = FakeClock(), io.StringIO()
    lines = ProgressLines("pretrain", 100, 0, 30.0, samples_per_step=8, clock=clock, file=out)
    written, record = {}, None
    for step in range(1, 101):
        clock.now += 2.0  # two seconds a step
        if step % 10 == 0:  # the loop hands on its last logged record
            record = {"step": step, "loss": 5.0 - step / 100, "tokens_per_s": 400.0}
        line = lines.update(step, record, done=step == 100)
        if line is not None:
            written[step] = line
    # step 1, then every 30 s (15 steps of 2 s), then the last step
    assert list(written) == [1, 16, 31, 46, 61, 76, 91, 100]
    assert out.getvalue().splitlines() == list(written.values())
    assert written[1] == "pretrain step 1/100 (1%) | loss - | 2 s/step, 4 samples/s | elapsed 2s, ETA 3m18s"
    # the speed of the steps since the previous line; the last logged loss and tokens/s
    assert written[16] == ("pretrain step 16/100 (16%) | loss 4.9000 | 2 s/step, 4 samples/s, 400 tokens/s"
                           " | elapsed 32s, ETA 2m48s")
    assert written[100].endswith("| done in 3m20s")


def test_lines_after_a_resume_start_from_the_checkpoints_step():
    clock = FakeClock()
    lines = ProgressLines("finetune", 50, 20, 30.0, clock=clock, file=io.StringIO())
    clock.now += 1.0
    assert lines.update(21).startswith("finetune step 21/50 (42%) | loss - | 1 steps/s | elapsed 1s, ETA 29s")
    clock.now += 1.0
    assert lines.update(22) is None


def test_a_terminal_gets_the_bar_a_log_gets_lines_and_progress_false_neither(capsys):
    lines = make_progress("train", 10, 0, enabled=True, every_s=30.0, terminal=False)
    assert isinstance(lines, ProgressLines)
    bar = make_progress("train", 10, 0, enabled=True, every_s=30.0, terminal=True)
    assert isinstance(bar, ProgressBar) and not bar.bar.disable
    bar.close()
    capsys.readouterr()
    off = make_progress("train", 10, 0, enabled=False, every_s=30.0, terminal=False)
    assert isinstance(off, ProgressBar) and off.bar.disable
    for step in range(1, 11):
        off.update(step, {"loss": 1.0}, done=step == 10)
    off.write("step 10: dev accuracy 0.5000")  # messages still show
    off.close()
    assert capsys.readouterr().err == "step 10: dev accuracy 0.5000\n"


def test_the_estimate_times_the_steps_after_the_first_and_speaks_once():
    clock = FakeClock(0.0)
    estimate = RunEstimate(0, 1000, skip=1, measure=3, clock=clock)
    durations = {1: 20.0, 2: 0.5, 3: 0.7, 4: 0.6}  # the first step compiles
    said, synced = [], []
    for step in range(1, 10):
        clock.now += durations.get(step, 0.6)
        if estimate.needs_sync(step):
            synced.append(step)
        message = estimate.step_done(step)
        if message:
            said.append((step, message))
    assert synced == [1, 4]
    # 21.8 s so far, then 996 steps of 0.6 s: ~10.3 minutes
    assert said == [(4, "timing: about 10 min for 1,000 steps (0.6 s/step over steps 2-4)")]


def test_the_estimate_of_a_resumed_run_counts_the_steps_left_and_a_short_run_gets_none():
    clock = FakeClock(0.0)
    estimate = RunEstimate(500, 600, clock=clock)
    messages = []
    for step in range(501, 510):
        clock.now += 2.0
        messages.append(estimate.step_done(step))
    assert [m for m in messages if m] == ["timing: about 3 min for 100 steps (2 s/step over steps 502-504)"]
    short = RunEstimate(0, 4, clock=clock)
    assert not any(short.needs_sync(s) or short.step_done(s) for s in range(1, 5))


def _batches(start: int):
    g = torch.Generator().manual_seed(start)
    while True:
        tokens = torch.randint(0, 50, (4, 8), generator=g)
        yield Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=torch.zeros(4, 8, dtype=torch.bool),
                    labels={"cls": torch.randint(0, 3, (4,), generator=g)})


def _trainer(tmp_path, **options) -> Trainer:
    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(
        tiny_model_dict(targets=[{"type": "cls", "num_labels": 3, "dropout": 0.0}])))
    cfg = TrainConfig(batch_size=4, warmup=0, log_every=2, tensorboard=False, save_minutes=None, **options)
    return Trainer(model, cfg, tmp_path, 6)


def test_training_without_a_terminal_writes_lines_and_the_estimate(tmp_path, capsys):
    trainer = _trainer(tmp_path, progress=True, progress_every_s=3600.0)
    capsys.readouterr()
    trainer.train(_batches)
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("train step ")]
    assert [line.split(" | ")[0] for line in progress] == ["train step 1/6 (17%)", "train step 6/6 (100%)"]
    assert " | loss - | " in progress[0] and " | done in " in progress[1]
    assert float(progress[1].split(" | ")[1].split()[1]) > 0  # the last logged loss
    timing = [line for line in err if line.startswith("timing: ")]
    assert len(timing) == 1 and re.fullmatch(r"timing: about \d+ (s|min) for 6 steps \(.* s/step over steps 2-4\)",
                                             timing[0]), timing


def test_progress_false_silences_the_lines_but_not_the_estimate(tmp_path, capsys):
    trainer = _trainer(tmp_path, progress=False)
    capsys.readouterr()
    trainer.train(_batches)
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if line.startswith("train step ")]
    assert len([line for line in err if line.startswith("timing: about ")]) == 1
