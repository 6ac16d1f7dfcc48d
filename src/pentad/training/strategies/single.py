"""``single`` and ``ddp``: the whole model on every process; checkpoints as one weights file.

``single`` is one process on one device. ``ddp`` wraps the model in
``DistributedDataParallel``: every rank holds the whole model and optimizer, gradients are
averaged across ranks in backward (skipped with ``no_sync`` until a step's last micro-batch).
Both write the same checkpoint (``model.safetensors`` + ``state.pt``, from the main rank), so a
``ddp`` run resumes under ``single`` and the other way round.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pentad import layout
from pentad.training import checkpoint as ckpt
from pentad.training.strategies.base import STRATEGIES, OptimizerFactory, Strategy


@STRATEGIES.register("single")
class SingleStrategy(Strategy):
    """One process, one device: today's training loop, bit for bit."""

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> nn.Module:
        self.module = self.model = model.to(self.device, dtype=self.param_dtype)
        self.optimizer = make_optimizer(self.module)
        return self.model

    # ------------------------------------------------------------------ state
    def save(self, directory: Path, state: dict[str, Any], metadata: dict[str, str]) -> None:
        if self.dist.is_main:
            ckpt.write_checkpoint_files(directory, self.module, {**state, "optimizer": self.optimizer.state_dict()},
                                        metadata)

    def load(self, directory: Path) -> dict[str, Any]:
        if layout.checkpoint_format(directory) == layout.DCP:  # an fsdp run's: resharded to the whole model
            from pentad.training.strategies.fsdp import load_sharded

            return load_sharded(self.module, self.optimizer, directory)
        if layout.checkpoint_format(directory) == layout.DEEPSPEED:  # a deepspeed run's: its partitions made whole
            return self._load_deepspeed(directory)
        # as saved: a LoRA run's adapters stay adapters (its frozen base is loaded already)
        ckpt.check_adapter_base(self.module, directory / layout.WEIGHTS)
        ckpt.load_weights(self.module, ckpt.read_weights(directory / layout.WEIGHTS, merge_adapters=False),
                          str(directory))
        state = ckpt.load_state(directory)
        self.optimizer.load_state_dict(state.pop("optimizer"))
        return state

    def _load_deepspeed(self, directory: Path) -> dict[str, Any]:
        """A ``deepspeed`` checkpoint: the whole fp32 weights and Adam moments consolidated from its
        ZeRO partitions (every rank reads them), in this optimizer's own state format."""
        from pentad.training import zero_checkpoint

        ckpt.check_adapter_base(self.module, directory)
        ckpt.load_weights(self.module, ckpt.read_checkpoint_weights(directory, merge_adapters=False), str(directory))
        names = {id(p): n for n, p in self.module.named_parameters()}
        order = [p for group in self.optimizer.param_groups for p in group["params"]]
        step, moments = zero_checkpoint.read_adam_states(directory, [names[id(p)] for p in order])
        saved = self.optimizer.state_dict()
        saved["state"] = {i: {"step": step.clone(), **{k: v.to(p.device, p.dtype).reshape(p.shape)
                                                        for k, v in moments[names[id(p)]].items()}}
                          for i, p in enumerate(order)}
        self.optimizer.load_state_dict(saved)
        state = ckpt.load_state(directory)
        for key in ("strategy", "zero_stage", "weights_metadata"):
            state.pop(key, None)
        return state

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        if not self.dist.is_main:
            return None
        return {k: v.detach().to("cpu") for k, v in self.module.state_dict().items()}

    def load_full_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        ckpt.load_weights(self.module, tensors, "the best model")


@STRATEGIES.register("ddp")
class DDPStrategy(SingleStrategy):
    """``torch.nn.parallel.DistributedDataParallel`` over every rank of the launch."""

    needs_launcher = True

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        self.module = model.to(self.device, dtype=self.param_dtype)
        ids = [self.device.index] if self.device.type == "cuda" else None
        # every parameter takes part in every step of pentad's models; unused ones would be a bug
        # buffers (position ids, masks) are constants, the same on every rank: no per-forward broadcast
        options = {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(
            DistributedDataParallel).parameters else {"broadcast_buffers": False}
        self.model = DistributedDataParallel(self.module, device_ids=ids, gradient_as_bucket_view=True, **options)
        self.optimizer = make_optimizer(self.module)
        return self.model

    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        if last:
            yield
        else:
            with self.model.no_sync():
                yield
