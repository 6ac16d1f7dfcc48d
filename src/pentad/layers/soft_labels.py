"""Soft-label losses: a student's logits against a teacher's (knowledge distillation, Hinton et al. 2015,
"Distilling the Knowledge in a Neural Network").

``kl``: KL(softmax(t/T) || softmax(s/T)) * T^2 per distribution (the T^2 keeps the gradient's scale
independent of T, section 2 of the paper), averaged over the distributions. ``mse``: the mean squared
error of the raw logits (no temperature), as TencentPretrain's ``run_classifier --soft_targets``.
Both are computed in float32.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

SoftLoss = Literal["kl", "mse"]


def soft_label_loss(student: Tensor, teacher: Tensor, temperature: float, kind: SoftLoss, dim: int = -1,
                    rows: Tensor | None = None, entries: Tensor | None = None) -> Tensor:
    """The soft-label loss of ``student`` against ``teacher`` logits of the same shape, the classes along
    ``dim``.

    rows: bool, the shape of the logits without ``dim``: the distributions that count (True); default all.
    entries: bool, the shape of the logits: the classes that exist (False: a padding position, a dummy
    choice), left out of both distributions (kl) or of the mean (mse).
    A batch with nothing that counts gives 0 (with a gradient path).
    """
    if student.shape != teacher.shape:
        raise ValueError(f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} differ")
    s, t = student.float(), teacher.detach().float()
    dim = dim % s.dim()
    if rows is not None:
        keep = rows.unsqueeze(dim).expand_as(s)
        entries = keep if entries is None else entries & keep
    if kind == "mse":
        squared = (s - t) ** 2
        if entries is None:
            return squared.mean()
        return torch.where(entries, squared, torch.zeros_like(squared)).sum() / entries.sum().clamp(min=1)
    if kind != "kl":
        raise ValueError(f"unknown soft-label loss {kind!r} (kl or mse)")
    low = torch.finfo(torch.float32).min
    s, t = (s / temperature).clamp(min=low), (t / temperature).clamp(min=low)
    if entries is not None:
        s, t = s.masked_fill(~entries, low), t.masked_fill(~entries, low)
    log_s, log_t = F.log_softmax(s, dim=dim), F.log_softmax(t, dim=dim)
    p_t = log_t.exp()
    kl = torch.where(p_t > 0, p_t * (log_t - log_s), torch.zeros_like(p_t)).sum(dim) * temperature ** 2
    if rows is None:
        return kl.mean()
    return torch.where(rows, kl, torch.zeros_like(kl)).sum() / rows.sum().clamp(min=1)


def binary_soft_label_loss(student: Tensor, teacher: Tensor, temperature: float, kind: SoftLoss) -> Tensor:
    """Independent sigmoids (multi-label): ``kl`` is the Bernoulli KL(sigmoid(t/T) || sigmoid(s/T)) * T^2
    per logit, averaged over all of them (as binary cross-entropy averages over rows and labels);
    ``mse`` the mean squared error of the raw logits."""
    if student.shape != teacher.shape:
        raise ValueError(f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} differ")
    s, t = student.float(), teacher.detach().float()
    if kind == "mse":
        return ((s - t) ** 2).mean()
    s, t = s / temperature, t / temperature
    p_t = torch.sigmoid(t)
    kl = (p_t * (F.logsigmoid(t) - F.logsigmoid(s)) + (1 - p_t) * (F.logsigmoid(-t) - F.logsigmoid(-s)))
    return kl.mean() * temperature ** 2
