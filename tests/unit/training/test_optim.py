"""The optimizer: which parameters decay, and Adam with and without bias correction."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pentad.training.config import TrainConfig
from pentad.training.optim import UncorrectedAdamW, build_optimizer, build_schedule, decay_groups


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(11, 6)
        self.norm = nn.LayerNorm(6)
        self.dense = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, ids):
        return self.out(torch.tanh(self.dense(self.norm(self.embedding(ids))))).sum(1)


def test_biases_and_norm_weights_get_no_weight_decay():
    model = Tiny()
    optimizer = build_optimizer(model, TrainConfig(weight_decay=0.05))
    decays = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = {name: decays[id(p)] for name, p in model.named_parameters()}
    assert names == {"embedding.weight": 0.05, "norm.weight": 0.0, "norm.bias": 0.0, "dense.weight": 0.05,
                     "dense.bias": 0.0, "out.weight": 0.05, "out.bias": 0.0}


def test_tied_parameter_is_in_one_group_once():
    model = Tiny()
    model.out = nn.Linear(6, 11)
    model.out.weight = model.embedding.weight
    params = [p for g in decay_groups(model, 0.01) for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))


def reference_step(p, m, v, g, t, lr, betas, eps, wd, correct):
    """Adam with decoupled weight decay, written out (decay applied to the pre-update weights, as torch does)."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    step = lr * m / (v.sqrt() + eps)
    if correct:
        step = lr / (1 - b1 ** t) * m / ((v / (1 - b2 ** t)).sqrt() + eps)
    return p - lr * wd * p - step, m, v


@pytest.mark.parametrize("correct", [True, False])
def test_adam_with_and_without_bias_correction_matches_the_formula(correct):
    torch.manual_seed(0)
    model = Tiny().double()
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1, adam_bias_correction=correct, warmup=0, schedule="constant")
    optimizer = build_optimizer(model, cfg)
    assert isinstance(optimizer, UncorrectedAdamW) is (not correct)
    ref = {n: (p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for n, p in model.named_parameters()}
    wd = {n: (0.0 if p.ndim < 2 else 0.1) for n, p in model.named_parameters()}
    for t in range(1, 8):
        ids = torch.randint(0, 11, (4, 5))
        optimizer.zero_grad()
        model(ids).square().mean().backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        for n, p in model.named_parameters():
            ref[n] = reference_step(*ref[n], grads[n], t, 1e-2, cfg.betas, cfg.eps, wd[n], correct)
            torch.testing.assert_close(p.detach(), ref[n][0], rtol=1e-10, atol=1e-12)
    # the configured values are what the groups (and so checkpoints and logs) hold
    assert [g["lr"] for g in optimizer.param_groups] == [1e-2, 1e-2]
    assert [g["eps"] for g in optimizer.param_groups] == [cfg.eps, cfg.eps]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_uncorrected_first_step_is_larger_by_the_missing_correction():
    """Step 1 moves each weight by lr * (1 - beta1) / sqrt(1 - beta2) (~3.16 lr) instead of lr."""
    moved = {}
    for correct in (True, False):
        torch.manual_seed(0)
        model = Tiny()
        before = model.dense.weight.detach().clone()
        optimizer = build_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.0, adam_bias_correction=correct))
        model(torch.randint(0, 11, (4, 5))).square().mean().backward()
        optimizer.step()
        moved[correct] = (model.dense.weight.detach() - before).abs().max().item()
    assert moved[True] == pytest.approx(1e-3, rel=1e-3)
    assert moved[False] == pytest.approx(1e-3 * 0.1 / math.sqrt(0.001), rel=1e-3)


def test_uncorrected_optimizer_resumes_exactly():
    def run(steps, resume_at=None):
        torch.manual_seed(0)
        model = Tiny()
        cfg = TrainConfig(lr=1e-2, adam_bias_correction=False)
        optimizer = build_optimizer(model, cfg)
        schedule = build_schedule(optimizer, cfg, steps)
        data = torch.Generator().manual_seed(1)
        for t in range(steps):
            if t == resume_at:
                state = {k: v.clone() for k, v in model.state_dict().items()}
                opt_state, sched_state = optimizer.state_dict(), schedule.state_dict()
                model = Tiny()
                model.load_state_dict(state)
                optimizer = build_optimizer(model, cfg)  # built, then loaded, as the Trainer does
                schedule = build_schedule(optimizer, cfg, steps)
                optimizer.load_state_dict(opt_state)
                schedule.load_state_dict(sched_state)
            optimizer.zero_grad()
            model(torch.randint(0, 11, (4, 5), generator=data)).square().mean().backward()
            optimizer.step()
            schedule.step()
        return model.dense.weight.detach()

    assert torch.equal(run(6), run(6, resume_at=3))
