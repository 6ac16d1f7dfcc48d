"""AdamW with decoupled weight decay (with or without Adam's bias correction), and warmup +
linear/cosine/constant learning-rate schedules."""

from __future__ import annotations

import math

import torch
from torch import nn

from pentad.training.config import TrainConfig


class UncorrectedAdamW(torch.optim.AdamW):
    """AdamW without bias correction of the moment estimates, as in BERT's original optimiser
    (and TencentPretrain's ``AdamW(correct_bias=False)``): ``p -= lr * (m / (sqrt(v) + eps) + wd * p)``.

    With ``m`` and ``v`` started at zero, the uncorrected step ``m / sqrt(v)`` is
    ``(1 - beta1^t) / sqrt(1 - beta2^t)`` times the corrected one: about 3x at step 1, 6.5x at
    step 10, 3x at step 100 and 1.3x at step 1,000 (betas 0.9, 0.999), so early steps are larger
    than with torch's AdamW at the same ``lr``. Computed by torch's (fused) AdamW with the step size,
    epsilon and weight decay of each group rescaled for the step, which cancels its correction
    exactly; the group's values are restored afterwards, so schedules, logs and checkpoints see the
    configured ones. ``t`` is the group's step count (a parameter that had no gradient at some
    steps is corrected with its group's count).
    """

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        saved = []
        for group in self.param_groups:
            steps = [self.state[p]["step"] for p in group["params"] if p.grad is not None and self.state[p]]
            t = int(max(steps)) + 1 if steps else 1
            beta1, beta2 = group["betas"]
            correction1, root2 = 1.0 - beta1 ** t, math.sqrt(1.0 - beta2 ** t)
            saved.append((group["lr"], group["eps"], group["weight_decay"]))
            # torch: p *= 1 - lr*wd; p -= lr/c1 * m / (sqrt(v)/r2 + eps), with c1 = 1 - beta1^t, r2 = sqrt(1 - beta2^t)
            group["lr"] = group["lr"] * correction1 / root2
            group["eps"] = group["eps"] / root2
            group["weight_decay"] = group["weight_decay"] * root2 / correction1
        try:
            return super().step(closure)
        finally:
            for group, (lr, eps, weight_decay) in zip(self.param_groups, saved):
                group["lr"], group["eps"], group["weight_decay"] = lr, eps, weight_decay


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Parameter groups: matrices and embedding tables decay; biases and norm weights (1-d
    parameters) do not, as in BERT and TencentPretrain (whose no-decay names are ``bias``,
    ``gamma``, ``beta``). Each shared (tied) parameter appears once."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over ``decay_groups``, with Adam's bias correction unless ``cfg.adam_bias_correction``
    is off (``UncorrectedAdamW``).

    The fused implementation (one kernel over all parameters) is several times faster per step
    on a CPU than the per-tensor loop (bench/RESULTS.md), and exact enough to resume bitwise.
    """
    kind = torch.optim.AdamW if cfg.adam_bias_correction else UncorrectedAdamW
    return kind(decay_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def tencentpretrain_lr_factor(step: int, total: float, warmup: float, schedule: str) -> float:
    """TencentPretrain's multiplier at optimizer step ``step`` (0-based, the step counter of its
    ``LambdaLR`` before the step): ``step / warmup`` during warmup (the first step at 0) with an
    unrounded ``warmup``, then linear to zero at ``total`` (never below), a half cosine (not clamped past
    ``total``, as its scheduler), or constant."""
    if step < warmup:
        return step / max(1.0, warmup)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1.0, total - warmup)
    if schedule == "linear":
        return max(0.0, (total - step) / max(1.0, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int,
                   nominal_steps: float | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step (not per micro-batch), sized to ``total_steps``; under
    ``train.schedule_convention=tencentpretrain`` to ``nominal_steps`` when given (the length its
    fine-tuning scripts count, which can differ from the steps run by one or two), warmup unrounded."""
    if cfg.schedule_convention == "tencentpretrain":
        length = float(nominal_steps if nominal_steps is not None else total_steps)
        warmup_steps = cfg.warmup * length if cfg.warmup < 1 else cfg.warmup
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: tencentpretrain_lr_factor(step, length, warmup_steps, cfg.schedule))
    warmup = cfg.warmup_steps(total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, cfg.schedule))
