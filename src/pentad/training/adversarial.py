"""Adversarial training on the embeddings (``train.adversarial``): FGM and PGD.

After a micro-batch's ordinary backward, the perturbed table(s) (by default every word-embedding
table) move along the gradient that micro-batch gave them, the loss of the perturbed model is
backpropagated too (its gradient adds to the clean one), and the tables are put back exactly:

* FGM (Miyato et al. 2017, "Adversarial Training Methods for Semi-Supervised Text Classification"):
  one step ``r = epsilon * g / ||g||``.
* PGD (Madry et al. 2018, "Towards Deep Learning Models Resistant to Adversarial Attacks", as applied
  to embeddings by FreeLB-style fine-tuning): ``steps`` steps of ``alpha * g / ||g||``, each projected
  back into the L2 ball of radius ``epsilon`` around the clean table; the first step follows the clean
  gradient, each later one the gradient of the adversarial loss at the current perturbation. Only the
  last perturbation's gradient is added to the model's gradients; the earlier ones are computed for the
  embedding tables alone (``torch.autograd.grad``), through the unwrapped model.

Norms are taken over each whole table (as the usual implementations do). A micro-batch whose gradient
on a table is zero or not finite (a rank's stand-in row; an fp16 overflow, which the gradient scaler
then skips) leaves that table unperturbed. No host synchronisation is added.

With ``ddp`` the clean backward runs without gradient reduction and the adversarial backward of a step's
last micro-batch reduces the sum once, so a step still costs one all-reduce of the gradients. Each
perturbation follows the gradient of the whole global micro-batch, as in one process: the perturbed
tables' gradients (only those) are summed over the ranks before each step (one all-reduce of the tables
per FGM step or PGD step), so two ranks train exactly what one process trains.
Sharded engines (``fsdp``, ``deepspeed``) hold each table in pieces that ``torch`` code cannot move as
one; they are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import Tensor, nn

from pentad.errors import UserError
from pentad.training.config import AdversarialConfig

SUPPORTED_STRATEGIES = ("single", "ddp")


def embedding_parameters(model: nn.Module, pattern: str | None = None) -> list[tuple[str, nn.Parameter]]:
    """The parameters adversarial training perturbs: those whose names match the glob ``pattern``, or by
    default the word-embedding table of every embedding slot (``word_embedding_weight()``: the model's,
    a second stream's, a decoder's), each shared table once."""
    names = {id(p): n for n, p in model.named_parameters()}
    if pattern is None:
        found: dict[int, tuple[str, nn.Parameter]] = {}
        for _, module in model.named_modules():
            weight_of = getattr(module, "word_embedding_weight", None)
            weight = weight_of() if callable(weight_of) else None
            if isinstance(weight, nn.Parameter) and id(weight) in names:
                found.setdefault(id(weight), (names[id(weight)], weight))
        if not found:
            raise UserError("train.adversarial perturbs the word-embedding table by default, and this model has "
                            "none (no embedding slot with a 'word' part); name the parameter(s) to perturb with "
                            "train.adversarial.parameter=PATTERN (a glob over parameter names). "
                            + _candidates(names.values()))
        matched = list(found.values())
    else:
        matched = [(n, p) for n, p in model.named_parameters() if fnmatchcase(n, pattern)]
        if not matched:
            raise UserError(f"train.adversarial.parameter={pattern!r} matches no parameter of the model (it is a "
                            f"glob over full parameter names, e.g. 'embedding.word.weight' or '*word.weight'). "
                            + _candidates(names.values()))
    frozen = [n for n, p in matched if not p.requires_grad or not p.is_floating_point()]
    if frozen:
        chosen = f"train.adversarial.parameter={pattern!r} matches" if pattern else "train.adversarial perturbs"
        one = len(frozen) == 1
        raise UserError(f"{chosen} {', '.join(frozen)}, which {'is' if one else 'are'} not trained (frozen: "
                        f"train.lora trains its adapters only), so no gradient reaches {'it' if one else 'them'} to "
                        "perturb along. Adversarial training needs trained embedding weights: leave train.lora "
                        "unset, or set train.adversarial.method=none.")
    return matched


def _candidates(names: Any) -> str:
    names = list(names)
    embedding = [n for n in names if "embedding" in n]
    shown = embedding or names
    more = f" (and {len(shown) - 12} more)" if len(shown) > 12 else ""
    return (f"The model's {'embedding ' if embedding else ''}parameters: {', '.join(shown[:12])}{more}.")


class Adversary:
    """FGM or PGD for the Trainer (see the module docstring).

    Per micro-batch the Trainer wraps its clean forward and backward in :meth:`capture` (which keeps the
    gradient that backward gives each perturbed table, before it is accumulated into ``.grad``), under
    ``strategy.accumulate(last=False)``, then calls :meth:`attack` with a function that computes the
    micro-batch's loss (the same autocast, distillation and rank scaling as the clean loss) through the
    module it is given. ``attack`` backpropagates the adversarial loss divided by ``grad_accum`` under
    ``strategy.accumulate(last=...)`` and returns its value.
    """

    def __init__(self, cfg: AdversarialConfig, strategy: Any, grad_accum: int = 1):
        name = getattr(strategy, "registry_name", "single")
        if name not in SUPPORTED_STRATEGIES:
            raise UserError(
                f"train.adversarial.method={cfg.method} is not available with train.strategy={name}: adversarial "
                f"training moves each embedding table as a whole along its gradient and puts it back, and {name} "
                f"holds the tables in shards that only its engine can update. Use train.strategy=ddp (every rank "
                f"holds the whole model; gradients are still reduced once per step) or single, or set "
                f"train.adversarial.method=none.")
        if cfg.method == "none":
            raise ValueError("Adversary needs method fgm or pgd")
        self.cfg = cfg
        self.strategy = strategy
        self.grad_accum = grad_accum
        self.params = embedding_parameters(strategy.module, cfg.parameter)
        self._captured: list[Tensor | None] = [None] * len(self.params)

    def describe(self) -> str:
        tables = ", ".join(n for n, _ in self.params)
        if self.cfg.method == "fgm":
            return f"adversarial training: fgm, epsilon {self.cfg.epsilon:g}, on {tables}"
        return (f"adversarial training: pgd, {self.cfg.steps} step(s) of {self.cfg.alpha:g} within epsilon "
                f"{self.cfg.epsilon:g}, on {tables}")

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Around the clean backward: keep each perturbed table's gradient from this micro-batch alone."""
        self._captured = [None] * len(self.params)
        handles = [p.register_hook(self._keeper(i)) for i, (_, p) in enumerate(self.params)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _keeper(self, index: int) -> Callable[[Tensor], None]:
        def keep(grad: Tensor) -> None:
            # a copy: the engine may accumulate into the tensor it is given
            self._captured[index] = grad.detach().clone() if self._captured[index] is None \
                else self._captured[index] + grad.detach()

        return keep

    def attack(self, loss_of: Callable[[nn.Module], Tensor], last: bool) -> Tensor:
        """Perturb, backpropagate the adversarial loss (divided by ``grad_accum``), restore; returns the
        adversarial loss (undivided, detached). ``loss_of(module)``: the micro-batch's loss through
        ``module`` (the strategy's wrapped model for the backward that counts, its plain module for
        PGD's intermediate gradients)."""
        strategy = self.strategy
        params = [p for _, p in self.params]
        clean = [p.detach().clone() for p in params]
        grads = self._captured
        self._captured = [None] * len(self.params)
        try:
            with torch.no_grad():
                self._move(params, clean, self._global(grads))
            if self.cfg.method == "pgd":
                for _ in range(self.cfg.steps - 1):
                    loss = loss_of(strategy.module)
                    if strategy.scaler is not None:  # fp16: the scaled loss keeps small gradients representable
                        loss = strategy.scaler.scale(loss)
                    found = torch.autograd.grad(loss, params, allow_unused=True)
                    with torch.no_grad():
                        self._move(params, clean, self._global(list(found)))
            with strategy.accumulate(last=last):
                loss = loss_of(strategy.model)
                strategy.backward(loss / self.grad_accum)
        finally:
            with torch.no_grad():
                for p, saved in zip(params, clean):
                    p.copy_(saved)
        return loss.detach()

    def _global(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        """With several ranks, each table's gradient summed over the ranks (each rank's is its share of the
        global micro-batch's: the sum has the direction of the gradient one process computes)."""
        dist = getattr(self.strategy, "dist", None)
        if dist is None or dist.world_size == 1:
            return grads
        summed: list[Tensor | None] = []
        for (_, p), g in zip(self.params, grads):
            g = torch.zeros_like(p) if g is None else g.detach().clone()
            summed.append(dist.all_reduce(g))
        return summed

    def _move(self, params: list[nn.Parameter], clean: list[Tensor], grads: list[Tensor | None]) -> None:
        """One step along ``grads`` (normalised per table): of ``epsilon`` (fgm) or of ``alpha`` projected
        into the ``epsilon`` ball around ``clean`` (pgd)."""
        pgd = self.cfg.method == "pgd"
        length = self.cfg.alpha if pgd else self.cfg.epsilon
        for p, base, g in zip(params, clean, grads):
            if g is None:
                continue
            p.add_(unit_step(g, length).to(p.dtype))
            if pgd:
                p.copy_(base + project(p - base, self.cfg.epsilon))


def unit_step(grad: Tensor, length: float) -> Tensor:
    """``length * grad / ||grad||`` (L2 over the whole tensor, in float32); zeros when the norm is 0 or not
    finite. No host synchronisation."""
    g = grad.float()
    norm = torch.linalg.vector_norm(g)
    ok = torch.isfinite(norm) & (norm > 0)
    factor = torch.where(ok, length / norm.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(norm))
    return torch.where(ok, g * factor, torch.zeros_like(g))


def project(r: Tensor, radius: float) -> Tensor:
    """``r`` scaled back onto the L2 ball of ``radius`` when it lies outside it (else unchanged)."""
    norm = torch.linalg.vector_norm(r.float())
    factor = (radius / norm.clamp_min(torch.finfo(torch.float32).tiny)).clamp(max=1.0)
    return (r.float() * factor).to(r.dtype)
