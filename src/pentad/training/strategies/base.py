"""The execution seam: how a model is placed, stepped and checkpointed on one or many processes.

The Trainer never calls ``model.to``, ``backward``, ``clip_grad_norm_``, ``optimizer.step`` or the
checkpoint writer itself; it asks its :class:`Strategy`. A strategy is chosen by ``train.strategy``
and registered in :data:`STRATEGIES` (``single``, ``ddp``, ``fsdp``, ``deepspeed``).

Life of a strategy, as the Trainer and the run session use it::

    strategy = STRATEGIES.get(cfg.strategy)(cfg, dist)    # dist: a pentad.training.distributed.Dist
    model = strategy.setup(model, make_optimizer)         # wraps/shards; .optimizer is set
    schedule = build_schedule(strategy.optimizer, ...)    # the schedule drives strategy.optimizer
    for each optimizer step:
        for each micro-batch:
            with strategy.accumulate(last=...):           # no gradient sync before the last
                loss = ...forward through strategy.model...
                strategy.backward(loss / grad_accum)
        grad_norm = strategy.step(clip)                   # clip, optimizer step, zero the grads
    strategy.save(directory, state)  /  state = strategy.load(directory)   (every rank calls)
    strategy.full_state_dict()       /  strategy.load_full_state_dict(tensors)

Transformations of the model itself (activation checkpointing; LoRA adapters, which replace linear
layers and freeze the rest: :mod:`pentad.training.lora`) are applied before ``setup``, so every engine
wraps or shards the modules as they will train. A LoRA model's checkpoints hold only what trains
(:func:`pentad.training.checkpoint.saved_part`); its frozen base is loaded again from ``init``.

``strategy.model`` is what forward runs through (a DDP/FSDP/DeepSpeed wrapper or the model);
``strategy.module`` is the pentad :class:`~pentad.model.Model` itself, for evaluation and names.
Collective methods must be called by every rank in the same order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from pentad.errors import UserError
from pentad.registry import Registry
from pentad.training.precision import make_grad_scaler, param_dtype

if TYPE_CHECKING:
    from pentad.training.config import TrainConfig
    from pentad.training.distributed import Dist

STRATEGIES: Registry[Strategy] = Registry("strategies", singular="strategy")

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


class Strategy(ABC):
    """Places, steps and checkpoints one model for the Trainer (see the module docstring).

    ``sharded``: parameters are split across ranks (build on the meta device, sharded checkpoints).
    ``needs_launcher``: must run under torchrun/deepspeed even with one process.
    ``autocast``: the trainer runs forward under ``torch.autocast`` for ``train.precision=bf16`` and
    ``fp16`` (False: the engine applies the precision itself, as DeepSpeed's bf16 and fp16 do).
    ``precisions``: the ``train.precision`` modes the engine trains in (others are refused by
    :meth:`set_precision`, with ``precision_note`` saying why).
    """

    registry_name: ClassVar[str]
    sharded: ClassVar[bool] = False
    needs_launcher: ClassVar[bool] = False
    autocast: bool = True
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "tf32", "bf16", "bf16-true", "fp16")
    precision_note: ClassVar[str] = ""
    # whether step() can leave out a step whose loss or gradients are not finite (train.on_nonfinite=skip)
    skips_nonfinite: ClassVar[bool] = True

    def __init__(self, cfg: TrainConfig, dist: Dist):
        self.cfg = cfg          # the TrainConfig
        self.dist = dist        # pentad.training.distributed.Dist: rank, world_size, device, collectives
        self.model: nn.Module | None = None
        self.module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.precision = "fp32"  # the resolved train.precision (set_precision)
        self.scaler: torch.amp.GradScaler | None = None  # under fp16 autocast
        self.skipped: torch.Tensor | None = None  # the last step() was left out (1.0) or applied (0.0)

    def set_precision(self, precision: str) -> None:
        """Train in ``precision`` (resolved: not ``auto``); called before :meth:`setup`. A mode the
        engine does not offer is a UserError."""
        if precision not in self.precisions:
            raise UserError(f"train.precision={precision} is not offered with train.strategy={self.registry_name} "
                            f"(it trains in {', '.join(self.precisions)}){self.precision_note}")
        self.precision = precision
        self.scaler = make_grad_scaler(precision, self.device) if self.autocast else None

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype the engine casts the weights to (None: they stay as built, fp32)."""
        return param_dtype(self.precision)

    @classmethod
    def check_installed(cls) -> None:
        """Raise a UserError naming the extra to install when the engine's package is missing."""
        return None

    # ------------------------------------------------------------------ placement
    @property
    def device(self) -> torch.device:
        return self.dist.device

    @abstractmethod
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> nn.Module:
        """Move/wrap/shard ``model`` (built on CPU, or on the meta device when ``sharded``), build
        its optimizer with ``make_optimizer`` (over the parameters the engine trains) and return
        the module forward runs through. Sets ``model``, ``module`` and ``optimizer``."""

    # ------------------------------------------------------------------ one step
    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Around forward and backward of one micro-batch; ``last``: the step's last micro-batch
        (engines with ``no_sync`` skip the gradient reduction before it)."""
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (already divided by ``grad_accum``; scaled by the
        gradient scaler under fp16)."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self, clip_grad_norm: float | None, loss_nonfinite: torch.Tensor | None = None
             ) -> torch.Tensor | None:
        """Clip the gradients (when ``clip_grad_norm`` is set), step the optimizer and zero the
        gradients; returns the total gradient norm before clipping (a tensor, no host sync), or
        None when not clipping. Engines whose parameters are torch tensors or DTensors share this.
        Under fp16 the gradients are unscaled before clipping, and the scaler skips a step whose
        gradients overflowed.

        ``loss_nonfinite``: 1.0 when the step's loss was NaN or infinite on some rank (a 0-dim tensor,
        the same on every rank), else 0.0; given, the step is left out when that loss or the total
        gradient norm is not finite, and ``skipped`` says so (a 0-dim tensor). The decision stays on the
        device: the fused optimizer reads it as ``found_inf`` (as under the gradient scaler) and neither
        moves the weights nor counts the step, without a host sync. Under fp16 the scaler decides about
        the gradients (it skips an overflow and lowers its scale: not counted); only the loss counts."""
        norm = None
        self.skipped = None
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if clip_grad_norm is not None:
            # foreach: one fused kernel over all gradients on a GPU (torch has no CPU foreach kernels)
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), clip_grad_norm,
                                                  foreach=True if self.device.type == "cuda" else None)
            if hasattr(norm, "full_tensor"):  # a DTensor (sharded parameters): the norm over every rank's shards
                norm = norm.full_tensor()
        if loss_nonfinite is not None:
            if self.scaler is not None:
                self.skipped = loss_nonfinite.float()
            else:
                total = norm if norm is not None else self._grad_norm()
                self.skipped = torch.maximum(loss_nonfinite.to(total.device).float(), (~torch.isfinite(total)).float())
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.skipped is not None and getattr(self.optimizer, "_step_supports_amp_scaling", False):
            self.optimizer.found_inf = self.skipped  # a fused optimizer leaves the step out on the device
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        elif self.skipped is not None and bool(self.skipped):  # any other optimizer: decided on the host
            pass
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _grad_norm(self) -> torch.Tensor:
        """The total norm of the gradients (when not clipping, for the finiteness check of :meth:`step`)."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norm = torch.nn.utils.get_total_norm(grads, foreach=True if self.device.type == "cuda" else None)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    # ------------------------------------------------------------------ state
    @abstractmethod
    def save(self, directory: Path, state: dict[str, Any], metadata: dict[str, str]) -> None:
        """Write model weights, optimizer state and ``state`` (the trainer's: step, data position,
        schedule, RNG) into ``directory`` (an empty temporary directory every rank sees; the caller
        renames it into place). Called by every rank."""

    @abstractmethod
    def load(self, directory: Path) -> dict[str, Any]:
        """Read what :meth:`save` wrote (model and optimizer into the engine); returns ``state``.
        Called by every rank; a checkpoint written with another world size is resharded."""

    @abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on CPU (tied aliases included, as ``module.state_dict()``) on
        the main rank, None on the others. Called by every rank (sharded engines gather)."""

    @abstractmethod
    def load_full_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy whole-model weights (read on every rank, or only on the main rank for sharded
        engines, which broadcast) into the engine's parameters. Called by every rank."""

    def close(self) -> None:
        """Release engine resources (the process group is the session's)."""
        return None
