"""AdamW with decoupled weight decay, and warmup + linear/cosine/constant learning-rate schedules."""

from __future__ import annotations

import math

import torch
from torch import nn

from pentad.training.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; biases and norm weights (1-d parameters) get no weight decay, as in BERT.

    The fused implementation (one kernel over all parameters) is several times faster per step
    on a CPU than the per-tensor loop (bench/RESULTS.md), and exact enough to resume bitwise.
    """
    decay, no_decay = [], []
    for p in model.parameters():  # each shared (tied) parameter once
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True)


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


def build_schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
                   ) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step (not per micro-batch), sized to ``total_steps``."""
    warmup = cfg.warmup_steps(total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, cfg.schedule))
