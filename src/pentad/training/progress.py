"""What the training loop shows while it runs: a tqdm bar on a terminal, plain lines at a bounded rate
without one (CI logs, ``nohup``, a file), and one line estimating how long the run's steps take.

:func:`make_progress` picks the kind (``train.progress``, ``train.progress_every_s``); both kinds take
the same calls from the loop (:meth:`update` after each optimizer step, :meth:`write` for messages,
:meth:`close`). :class:`ProgressLines` and :class:`RunEstimate` read a clock they are given, so that
their decisions are tested without waiting.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

Clock = Callable[[], float]


def format_duration(seconds: float) -> str:
    """A duration for a progress line: ``42s``, ``6m21s``, ``2h05m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def about(seconds: float) -> str:
    """A rough duration for the run's estimate: ``40 s``, ``12 min``, ``3.5 h``."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _digits(value: float) -> str:
    """Three significant digits, never in exponent notation: ``0.0234``, ``74.2``, ``399``, ``1234``."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _count(value: float) -> str:
    """A rate with a unit prefix for large values: ``74.2``, ``399``, ``5.36k``, ``1.31M``."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{_digits(value / scale)}{unit}"
    return _digits(value)


def format_line(description: str, step: int, total: int, *, loss: float | None, steps_per_s: float | None,
                samples_per_step: int | None = None, tokens_per_s: float | None = None,
                elapsed: float = 0.0, done: bool = False) -> str:
    """One plain progress line: ``pretrain step 120/1000 (12%) | loss 3.4512 | 2.31 steps/s, 74 samples/s,
    18.2k tokens/s | elapsed 52s, ETA 6m21s``. ``steps_per_s`` None or 0: the speed and the ETA are not
    known yet; a rate below one step a second is shown as seconds per step; ``done``: the last line, which
    gives the time taken instead of the ETA (``stopped after`` it when the run ends before ``total``: early
    stopping, ``train.stop_at``)."""
    percent = 100.0 * step / total if total else 100.0
    parts = [f"{description} step {step:,}/{total:,} ({percent:.0f}%)",
             f"loss {loss:.4f}" if loss is not None else "loss -"]
    if steps_per_s:
        speed = [f"{_digits(steps_per_s)} steps/s" if steps_per_s >= 1 else f"{_digits(1 / steps_per_s)} s/step"]
        if samples_per_step:
            speed.append(f"{_count(steps_per_s * samples_per_step)} samples/s")
        if tokens_per_s:
            speed.append(f"{_count(tokens_per_s)} tokens/s")
        parts.append(", ".join(speed))
    if done:
        parts.append(f"{'done in' if step >= total else 'stopped after'} {format_duration(elapsed)}")
    else:
        eta = format_duration((total - step) / steps_per_s) if steps_per_s else "-"
        parts.append(f"elapsed {format_duration(elapsed)}, ETA {eta}")
    return " | ".join(parts)


class ProgressLines:
    """Plain progress lines, for a stderr that is not a terminal: one after the first step, then at most
    one every ``every_s`` seconds, and one after the last step. The speed is that of the steps since the
    previous line (the first line's includes the warm-up of the first step); the loss is the last logged
    one, the tokens per second those of the last logged record."""

    def __init__(self, description: str, total: int, initial: int, every_s: float, *,
                 samples_per_step: int | None = None, clock: Clock = time.monotonic,
                 file: TextIO | None = None):
        self.description = description
        self.total = total
        self.initial = initial
        self.every_s = every_s
        self.samples_per_step = samples_per_step
        self.clock = clock
        self.file = file
        self.start = self.last_time = clock()
        self.last_step = initial

    def update(self, step: int, record: dict[str, Any] | None = None, done: bool = False) -> str | None:
        """After optimizer step ``step`` (``record``: the last logged record; ``done``: the run's last step):
        the line written, or None when none is due."""
        now = self.clock()
        if not (done or step == self.initial + 1 or now - self.last_time >= self.every_s):
            return None
        seconds = now - self.last_time
        rate = (step - self.last_step) / seconds if seconds > 0 and step > self.last_step else None
        record = record or {}
        loss = record.get("loss")
        line = format_line(self.description, step, self.total, loss=float(loss) if loss is not None else None,
                           steps_per_s=rate, samples_per_step=self.samples_per_step,
                           tokens_per_s=record.get("tokens_per_s"), elapsed=now - self.start, done=done)
        self.write(line)
        self.last_time, self.last_step = now, step
        return line

    def write(self, message: str) -> None:
        print(message, file=self.file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


class ProgressBar:
    """The tqdm bar, for a terminal; the last logged loss is its postfix."""

    def __init__(self, description: str, total: int, initial: int, disable: bool = False):
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=description, unit="step", disable=disable,
                        dynamic_ncols=True, file=sys.stderr)
        self.shown: dict[str, Any] | None = None

    def update(self, step: int, record: dict[str, Any] | None = None, done: bool = False) -> None:
        self.bar.update(step - self.bar.n)
        if record and record is not self.shown and "loss" in record:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}")
            self.shown = record

    def write(self, message: str) -> None:
        """A message above the bar (printed even when the bar is off)."""
        self.bar.write(message, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def make_progress(description: str, total: int, initial: int, *, enabled: bool, every_s: float,
                  samples_per_step: int | None = None, terminal: bool | None = None) -> ProgressBar | ProgressLines:
    """The loop's progress display: off unless ``enabled`` (``train.progress``, on the main process); a
    tqdm bar when stderr is a terminal (``terminal``: None asks ``sys.stderr.isatty()``), plain lines every
    ``every_s`` seconds (``train.progress_every_s``) when it is not."""
    if terminal is None:
        terminal = sys.stderr.isatty()
    if enabled and not terminal:
        return ProgressLines(description, total, initial, every_s, samples_per_step=samples_per_step)
    return ProgressBar(description, total, initial, disable=not enabled)


class RunEstimate:
    """How long the run's steps will take, said once, from the time of a few steps: the first ``skip``
    steps after ``start`` are left out (compilation, allocator and data-loader warm-up), the next
    ``measure`` timed. :meth:`needs_sync` tells the loop at which steps to wait for the device first (the
    two ends of the timed steps), so that the clock sees the work done rather than the work queued."""

    def __init__(self, start: int, end: int, skip: int = 1, measure: int = 3, clock: Clock = time.perf_counter):
        self.start = start
        self.end = end
        self.first = start + skip  # the timing starts after this step
        self.last = start + skip + measure  # ... and ends after this one
        self.clock = clock
        self.began = clock()
        self.timed_from: float | None = None
        self.said = False

    def needs_sync(self, step: int) -> bool:
        return not self.said and self.last < self.end and step in (self.first, self.last)

    def step_done(self, step: int) -> str | None:
        """After optimizer step ``step`` (the device synchronised when :meth:`needs_sync` said so): the
        estimate, once, after the last timed step; None otherwise, and for a run too short to time."""
        if self.said or self.last >= self.end:
            return None
        if step == self.first:
            self.timed_from = self.clock()
        elif step == self.last and self.timed_from is not None:
            now = self.clock()
            per_step = (now - self.timed_from) / (self.last - self.first)
            expected = now - self.began + per_step * (self.end - step)
            self.said = True
            steps = self.end - self.start
            return (f"timing: about {about(expected)} for {steps:,} steps ({_digits(per_step)} s/step over steps "
                    f"{self.first + 1}-{self.last})")
        return None
