"""training.evaluation: the best model's record read back when a fine-tuning run resumes."""

from __future__ import annotations

import json

import pytest
import torch

from pentad.errors import UserError
from pentad.training import checkpoint as ckpt
from pentad.training.evaluation import BestModel, Evaluation


def _best(tmp_path, record: str) -> BestModel:
    best = BestModel(tmp_path / "best")
    ckpt.save_tensors({"w": torch.zeros(2)}, best.weights, {BestModel.KEY: record})
    return best


def test_the_best_models_record_is_read_back(tmp_path):
    best = _best(tmp_path, json.dumps({"step": 6, "score": 0.75, "metrics": {"accuracy": 0.75}}))
    best.restore()
    assert (best.step, best.score, best.metrics) == (6, 0.75, {"accuracy": 0.75})


@pytest.mark.parametrize("record", ["garbage{", "[1, 2]", '{"step": 3}', '{"step": "x", "score": 1, "metrics": {}}',
                                    '{"step": 3, "score": "high", "metrics": {}}',
                                    '{"step": 3, "score": NaN, "metrics": {}}',
                                    '{"step": 3, "score": 1, "metrics": 7}'])
def test_a_corrupt_best_model_record_is_a_clean_error(tmp_path, record):
    best = _best(tmp_path, record)
    with pytest.raises(UserError, match=f"{best.weights}: its record of the best model \\(metadata 'pentad_best'\\) "
                                        f"is corrupt.*Delete {best.directory} to resume without it"):
        best.restore()


class _Best:
    """Records what it is offered, as BestModel does, without writing weights."""

    def __init__(self):
        self.step, self.score, self.metrics = None, float("-inf"), {}

    def offer(self, trainer, step, score, metrics):
        if score > self.score:
            self.step, self.score, self.metrics = step, score, metrics


class _Trainer:
    def __init__(self, scores):
        self.scores, self.step = scores, 0

    def evaluate(self, evaluate):
        return evaluate(self.step)


def _run(scores: dict[int, float], patience, total=10):
    trainer = _Trainer(scores)
    hook = Evaluation(lambda step: {"accuracy": scores[step]}, set(scores), lambda m: m["accuracy"], _Best(), total,
                      patience)
    for step in range(1, total + 1):
        trainer.step = step
        if hook.after_step(trainer, step == total):
            return step, hook
    return None, hook


def test_the_evaluation_hook_keeps_the_best_and_stops_after_patience_evaluations_without_improving():
    stopped, hook = _run({2: 0.5, 4: 0.7, 6: 0.6, 8: 0.65, 10: 0.9}, patience=2)
    assert stopped == 8 and (hook.best.step, hook.best.score) == (4, 0.7)
    assert hook.stopped(8) and not hook.stopped(6)
    stopped, hook = _run({2: 0.5, 4: 0.7, 6: 0.6, 8: 0.65, 10: 0.9}, patience=None)
    assert stopped is None and hook.best.step == 10
    assert not hook.stopped(8)


def test_without_dev_metrics_the_latest_evaluation_is_the_best():
    trainer = _Trainer({})
    hook = Evaluation(lambda step: {}, {3, 6}, lambda m: 1 / 0, _Best(), 6)
    for step in (3, 6):
        trainer.step = step
        assert not hook.after_step(trainer, step == 6)
    assert hook.best.step == 6


def test_an_evaluation_without_metrics_logs_nothing(tmp_path, capsys):
    """A fine-tune without a dev set still evaluates (the latest model is the best) but has nothing to say:
    no empty ``step N:`` line, no metrics record."""
    from tests.unit.test_zoo import shrunk_model_config

    from pentad.builder import build_model
    from pentad.training.config import TrainConfig
    from pentad.training.trainer import Trainer

    trainer = Trainer(build_model(shrunk_model_config("bert/base")), TrainConfig(tensorboard=False, progress=False),
                      tmp_path, 1)
    capsys.readouterr()
    assert trainer.evaluate(lambda step: {}) == {}
    assert "step 0:" not in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists() or "dev_" not in (tmp_path / "metrics.jsonl").read_text()
    assert trainer.evaluate(lambda step: {"accuracy": 0.5}) == {"accuracy": 0.5}
    assert "step 0: dev accuracy 0.5000" in capsys.readouterr().err
