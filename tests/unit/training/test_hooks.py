"""The training loop's hooks: a behaviour of one's own is a Hook given to ``Trainer.train`` (the trainer
unchanged), a hook's backward pass adds its gradients and takes the step's gradient reduction when it is
the last backward, adversarial training is such a hook built from the config, and when to save is
``SaveSchedule``'s decision (every N steps, timed, at the end)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from tests.conftest import tiny_model_dict

from pentad import layout
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.model import total_loss
from pentad.training.adversarial import Adversary
from pentad.training.config import AdversarialConfig, TrainConfig
from pentad.training.distributed import Dist
from pentad.training.strategies.single import SingleStrategy
from pentad.training.trainer import AdversarialTraining, Hook, SaveSchedule, Trainer


def _model():
    torch.manual_seed(0)
    cfg = tiny_model_dict(targets=[{"type": "cls", "num_labels": 3, "dropout": 0.0}])
    return build_model(model_config_class().model_validate(cfg))


def _batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (4, 10), generator=g)
    padding = torch.zeros(4, 10, dtype=torch.bool)
    padding[2, -3:] = True
    return Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=padding,
                 labels={"cls": torch.randint(0, 3, (4,), generator=g)})


def _batches(start: int):
    i = start
    while True:
        yield _batch(i)
        i += 1


def _trainer(tmp_path: Path, steps: int = 3, **options) -> Trainer:
    settings = {"batch_size": 4, "lr": 1e-2, "warmup": 0, "log_every": 1, "progress": False, "tensorboard": False,
                "save_minutes": None, **options}
    return Trainer(_model(), TrainConfig(**settings), tmp_path, steps)


def _records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / layout.METRICS).read_text().splitlines()) if "loss" in r]


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _gradients_at_each_step(trainer: Trainer, monkeypatch) -> list[dict[str, torch.Tensor]]:
    """The gradients the optimizer is given at each step (filled while the trainer trains)."""
    seen: list[dict[str, torch.Tensor]] = []
    step = trainer.strategy.step

    def recording(clip, nonfinite=None):
        seen.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(clip, nonfinite)

    monkeypatch.setattr(trainer.strategy, "step", recording)
    return seen


class MicroBatchCounter(Hook):
    """A behaviour of one's own: counts the micro-batches trained on and logs the count."""

    def __init__(self) -> None:
        self.started_at: int | None = None
        self.seen = 0
        self.steps: list[int] = []

    def on_start(self, trainer: Trainer) -> None:
        self.started_at = trainer.step

    def before_forward(self, trainer: Trainer, batch: Batch) -> None:
        self.seen += 1

    def on_log(self, trainer: Trainer) -> dict:
        return {"micro_batches_seen": self.seen}

    def after_step(self, trainer: Trainer, done: bool) -> bool:
        self.steps.append(trainer.step)
        return False


class ExamplesSeen(Hook):
    """The example of docs/training.md."""

    def on_log(self, trainer):
        return {"examples": trainer.micro_batches * trainer.cfg.batch_size}


def test_a_hook_of_ones_own_adds_a_logged_value_and_changes_nothing_else(tmp_path):
    plain = _trainer(tmp_path / "plain", grad_accum=2)
    plain.train(_batches)
    counter = MicroBatchCounter()
    counted = _trainer(tmp_path / "counted", grad_accum=2)
    counted.train(_batches, hooks=[counter, ExamplesSeen()])
    records = _records(tmp_path / "counted")
    assert counter.started_at == 0 and counter.steps == [1, 2, 3]
    assert [r["micro_batches_seen"] for r in records] == [2, 4, 6]
    assert [r["examples"] for r in records] == [8, 16, 24]
    keys = list(records[0])
    assert keys.index("micro_batches_seen") == keys.index("lr") + 1  # after lr, as on_log says
    assert keys.index("examples") == keys.index("lr") + 2  # in the order of the hooks
    assert [r["loss"] for r in records] == [r["loss"] for r in _records(tmp_path / "plain")]
    assert all(torch.equal(a, b) for a, b in zip(_weights(plain).values(), _weights(counted).values()))


class Again(Hook):
    """Backpropagates the micro-batch's loss a second time, through ``loss_of`` (doubling the gradient),
    and records which backward it was told reduces gradients."""

    adds_backward = True

    def __init__(self, name: str):
        self.name = name
        self.reduced: list[bool] = []

    def backward(self, trainer, loss_of, reduce):
        self.reduced.append(reduce)
        with trainer.strategy.accumulate(last=reduce):
            loss = loss_of(trainer.forward_model)
            trainer.strategy.backward(loss / trainer.cfg.grad_accum)
        return {f"{self.name}_loss": loss.detach()}


def test_a_hooks_backward_adds_its_gradient_and_is_logged_like_a_loss(tmp_path, monkeypatch):
    plain = _trainer(tmp_path / "plain", steps=1)
    plain_grads = _gradients_at_each_step(plain, monkeypatch)
    plain.train(_batches)
    again = _trainer(tmp_path / "again", steps=1)
    again_grads = _gradients_at_each_step(again, monkeypatch)
    again.train(_batches, hooks=[Again("again")])
    for name, grad in plain_grads[0].items():
        assert torch.equal(again_grads[0][name], 2 * grad), name
    record = _records(tmp_path / "again")[0]
    assert record["again_loss"] == record["loss"] == _records(tmp_path / "plain")[0]["loss"]


def test_the_last_backward_of_the_last_micro_batch_reduces_gradients(tmp_path, monkeypatch):
    for hooks in ([], [Again("a"), Again("b")]):
        trainer = _trainer(tmp_path / str(len(hooks)), steps=2, grad_accum=2)
        told: list[bool] = []
        accumulate = trainer.strategy.accumulate

        @contextmanager
        def recording(last, accumulate=accumulate, told=told):
            told.append(last)
            with accumulate(last):
                yield

        monkeypatch.setattr(trainer.strategy, "accumulate", recording)
        trainer.train(_batches, hooks=hooks)
        if not hooks:  # the loop's own backward, on each step's last micro-batch
            assert told == [False, True] * 2
        else:  # per micro-batch: the loop's, a's, b's; only b's of the second micro-batch reduces
            assert told == [False, False, False, False, False, True] * 2
            assert hooks[0].reduced == [False] * 4 and hooks[1].reduced == [False, True] * 2


def test_a_hooks_backward_values_must_be_losses(tmp_path):
    class Named(Hook):
        adds_backward = True

        def backward(self, trainer, loss_of, reduce):
            return {"penalty": torch.zeros(())}

    with pytest.raises(ValueError, match=r"Named.backward returned 'penalty'.*end in '_loss'"):
        _trainer(tmp_path, steps=1).train(_batches, hooks=[Named()])


def test_adversarial_training_is_a_hook_of_the_trainer_with_the_gradient_of_fgm_by_hand(tmp_path, monkeypatch):
    assert _trainer(tmp_path / "plain").hooks == []
    options = {"method": "fgm", "epsilon": 0.5}
    trainer = _trainer(tmp_path / "fgm", steps=1, adversarial=options)
    assert [type(h) for h in trainer.hooks] == [AdversarialTraining]
    grads = _gradients_at_each_step(trainer, monkeypatch)
    trainer.train(_batches)
    # the same micro-batch by hand: the clean backward (its table gradient kept), then the attack
    model = _model()
    strategy = SingleStrategy(TrainConfig(), Dist())
    strategy.setup(model, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    adversary = Adversary(AdversarialConfig(**options), strategy)
    batch = _batch(0)
    with adversary.capture():
        clean = total_loss(strategy.model(batch))
        strategy.backward(clean)
    adversarial = adversary.attack(lambda module: total_loss(module(batch)), last=True)
    for name, p in model.named_parameters():
        assert torch.equal(grads[0][name], p.grad), name
    record = _records(tmp_path / "fgm")[0]
    assert record["loss"] == clean.item() and record["adv_loss"] == adversarial.item()


def test_the_save_schedule_saves_every_n_steps_after_the_minutes_and_at_the_end(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    saves = SaveSchedule(every=3, minutes=2)
    assert [step for step in range(1, 10) if saves.due(step, False, saves.timed())] == [3, 6, 9]
    clock[0] += 119.0
    assert not saves.timed()
    clock[0] += 1.0
    assert saves.timed() and saves.due(4, False, saves.timed())
    saves.saved()  # the minutes count from the last save
    assert not saves.timed()
    assert saves.due(4, True, False)  # the run's last step
    never = SaveSchedule(None, None)
    clock[0] += 1e6
    assert not never.timed() and not never.due(5, False, False) and never.due(5, True, False)


def test_timed_saves_in_the_loop(tmp_path):
    timed = _trainer(tmp_path / "timed", steps=3, save_minutes=1e-9, keep_checkpoints=5)  # due after every step
    timed.train(_batches)
    assert layout.checkpoint_steps(tmp_path / "timed") == [1, 2, 3]
    untimed = _trainer(tmp_path / "untimed", steps=3, save_every=2, keep_checkpoints=5)
    untimed.train(_batches)
    assert layout.checkpoint_steps(tmp_path / "untimed") == [2, 3]
