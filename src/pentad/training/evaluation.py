"""Evaluation during training as a hook of the loop: dev scores at chosen steps, the best model kept
in ``RUN/best``, and early stopping when the dev score stops improving.

The runner configures it (what to evaluate, how a score is chosen from the metrics, the patience);
the loop (:class:`~pentad.training.trainer.Trainer`) calls it after each step.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pentad import files, layout
from pentad.errors import UserError, shown
from pentad.runs import info
from pentad.training import checkpoint as ckpt
from pentad.training.trainer import Hook

if TYPE_CHECKING:
    from pentad.training.session import Session
    from pentad.training.trainer import Trainer


class BestModel:
    """The best model on dev so far, in ``RUN/best``: weights, and ``best.json`` (step and metrics).

    Its record (step, score, dev metrics) also travels in the weights file's metadata, written in
    one atomic rename with the weights, and is read back when a run resumes, so a resumed run keeps
    comparing against the best model it already has instead of overwriting it with a worse one.
    In a distributed run every rank keeps the record; the main rank writes the files.
    """

    KEY = "pentad_best"

    def __init__(self, directory: Path, session: Session | None = None):
        self.directory = directory
        self.session = session
        self.weights = directory / layout.WEIGHTS
        self.step: int | None = None
        self.score = -math.inf
        self.metrics: dict[str, float] = {}

    def offer(self, trainer: Trainer, step: int, score: float, metrics: dict[str, float]) -> bool:
        """Keep the trainer's model if ``score`` beats the best so far (every rank calls)."""
        if score <= self.score:
            return False
        record = {"step": step, "score": score, "metrics": metrics}
        tensors = trainer.strategy.full_state_dict()  # gathered on the main rank
        if tensors is not None:
            tensors = ckpt.saved_part(trainer.model, tensors)  # no tied aliases; a LoRA run's adapters only
            ckpt.save_tensors(tensors, self.weights,
                              {self.KEY: json.dumps(record), **ckpt.model_metadata(trainer.model)})
            files.write_json(self.directory / layout.BEST_RECORD, {"step": step, **metrics})
        self.step, self.score, self.metrics = step, score, dict(metrics)
        return True

    def restore(self, evaluated: Sequence[int] = (), step: int = 0) -> None:
        """Read the record of the best model a resumed run already has (none: keep the defaults).
        ``evaluated``: the steps at which the run evaluated before its checkpoint (of ``step``), each of
        which kept a best model: when that model is missing, the run is refused, not silently re-judged
        on the later evaluations only."""
        if not self.weights.is_file():
            if evaluated:
                steps = ", ".join(map(str, evaluated[:8])) + (", ..." if len(evaluated) > 8 else "")
                raise UserError(f"{self.weights} is missing, but this run evaluated at step(s) {steps} before the "
                                f"checkpoint it resumes from (step {step}): its best model so far is lost, and going "
                                "on would pick a best model among the later evaluations only and report it as the "
                                f"run's. Put {self.directory} back, or start afresh with --overwrite (or another "
                                "output directory)")
            return
        raw = ckpt.read_metadata(self.weights).get(self.KEY)
        if raw is None:  # written before the record was kept in the weights file
            info(f"{self.weights} has no record of its step and score; the next evaluation replaces it")
            return
        try:
            record = json.loads(raw)
            step, score, metrics = record["step"], float(record["score"]), record["metrics"]
            if (not isinstance(step, int) or isinstance(step, bool) or step < 0 or not math.isfinite(score)
                    or not isinstance(metrics, dict)):
                raise ValueError
        except (ValueError, TypeError, KeyError, RecursionError):
            raise UserError(f"{self.weights}: its record of the best model (metadata '{self.KEY}') is corrupt: "
                            "expected JSON {\"step\": int, \"score\": number, \"metrics\": {...}}, found "
                            f"{shown(raw)}. Delete {self.directory} to resume without it (the best model is then "
                            "chosen among the evaluations still to come).") from None
        self.step, self.score, self.metrics = step, score, metrics
        info(f"best model so far: step {self.step}, score {self.score:.4f}")

    def share(self) -> None:
        """The main rank's record on every rank (after :meth:`restore`, which reads files on the main rank)."""
        if self.session is not None:
            self.step, self.score, self.metrics = self.session.dist.broadcast_object(
                (self.step, self.score, self.metrics))

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class Evaluation(Hook):
    """Scores the model on dev at the steps in ``steps``, keeps the best one in ``best`` and, with
    ``patience``, stops training after that many evaluations in a row without a better score.

    ``evaluate(step)``: the dev metrics (every rank calls it and gets the same numbers; empty without
    a dev set, and then the latest step is the best). ``select(metrics)``: the score the best model is
    chosen by (higher is better). ``total``: the run's last step, where training ends anyway.
    """

    def __init__(self, evaluate: Callable[[int], dict[str, float]], steps: Collection[int],
                 select: Callable[[dict[str, float]], float], best: BestModel, total: int,
                 patience: int | None = None):
        self.evaluate = evaluate
        self.steps = steps
        self.select = select
        self.best = best
        self.total = total
        self.patience = patience

    def stale(self, step: int) -> int:
        """Dev evaluations up to ``step`` since the best one (all of them before any best)."""
        best = self.best.step
        return sum(1 for s in self.steps if s <= step and (best is None or s > best))

    def resume(self, session: Session, resumed: bool, step: int) -> None:
        """Before training: a resumed run (at ``step``) reads back the best model it already has (the main
        rank reads, every rank keeps the record); a run starting afresh removes an earlier attempt's."""
        if resumed:
            evaluated = sorted(s for s in self.steps if s <= step)
            session.on_main(lambda: self.best.restore(evaluated, step))
            self.best.share()
        else:  # an earlier attempt's best model belongs to a trajectory being redone
            session.on_main(self.best.clear)

    def stopped(self, step: int) -> bool:
        """Whether a run resumed at ``step`` had already stopped early there (it stays stopped)."""
        return self.patience is not None and 0 < step < self.total and self.best.step is not None \
            and self.stale(step) >= self.patience

    def after_step(self, trainer: Trainer, done: bool) -> bool:
        step = trainer.step
        if step not in self.steps:
            return False
        metrics = trainer.evaluate(self.evaluate)
        self.best.offer(trainer, step, self.select(metrics) if metrics else float(step), metrics)
        if self.patience is not None and step < self.total and self.stale(step) >= self.patience:
            info(f"early stopping at step {step}: {self.patience} dev evaluation(s) without improving on step "
                 f"{self.best.step}'s {self.best.score:.4f}")
            return True
        return False
