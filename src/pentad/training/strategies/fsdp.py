"""``fsdp``: parameters, gradients and optimizer state sharded across ranks with FSDP2 ``fully_shard``.

Every block of :meth:`pentad.model.Model.blocks` (transformer layers, ...) is one FSDP unit and the
root module holds the rest (embeddings, heads); in forward and backward each unit's weights are
all-gathered just before they are needed and freed after (``train.fsdp.reshard_after_forward``),
gradients are reduce-scattered (averaged, as DDP's all-reduce) and every rank steps the optimizer on
its own shards. ``train.fsdp.param_dtype`` / ``reduce_dtype`` set a ``MixedPrecisionPolicy``.

The model arrives built on the CPU on the main rank (the weights a ``single`` run starts from) and
on the meta device on the others. :meth:`FsdpStrategy.setup` shards the meta structure on every
rank, allocates each rank's shards on its device and fills them from the main rank's weights, so
no rank but the main one ever holds the whole model, and an fsdp run starts from exactly the
weights of a single run. Tied weights (a head sharing the word embedding) stay one parameter.

Checkpoints are ``torch.distributed.checkpoint`` (DCP) directories: ``dcp/`` holds model and
optimizer state, each rank writing its shards, and ``state.pt`` the trainer's state with a marker
of the format. DCP reshards on load, so a run resumes on another number of ranks.
:func:`pentad.training.checkpoint.read_checkpoint_weights` consolidates ``dcp/`` in one process
(``pentad export``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pentad import layout
from pentad.errors import UserError, writing
from pentad.training import checkpoint as ckpt
from pentad.training.strategies.base import STRATEGIES, OptimizerFactory, Strategy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@STRATEGIES.register("fsdp")
class FsdpStrategy(Strategy):
    """FSDP2 ``fully_shard`` per block and on the root, over every rank of the launch."""

    sharded = True
    needs_launcher = True
    precisions = ("fp32", "tf32", "bf16")
    precision_note = ("; for bf16 weights in forward and backward use train.fsdp.param_dtype=bf16 (the shards "
                      "stay fp32); fp16 would need a sharded gradient scaler, which is not offered")

    # ------------------------------------------------------------------ placement
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> nn.Module:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        main = self.dist.is_main
        tied = list(getattr(model, "tied", []))
        # the main rank's weights (a single run's) and buffers; then every rank shards the same meta structure
        full = {k: v.detach() for k, v in model.state_dict().items()} if main else {}
        buffers = {n: b.detach().to("cpu", copy=True) for n, b in model.named_buffers()} if main else None
        if main:
            _to_meta(model)
        self._check_tied(model, tied, "on the meta device")
        options: dict[str, Any] = {"mesh": init_device_mesh(self.device.type, (self.dist.world_size,)),
                                   "reshard_after_forward": self.cfg.fsdp.reshard_after_forward}
        param_dtype, reduce_dtype = self.cfg.fsdp.param_dtype, self.cfg.fsdp.reduce_dtype
        if (param_dtype, reduce_dtype) != ("fp32", "fp32"):
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype],
                                                        reduce_dtype=DTYPES[reduce_dtype])
        blocks = model.blocks() if hasattr(model, "blocks") else []
        for block in blocks:
            fully_shard(block, **options)
        fully_shard(model, **options)
        model.to_empty(device=self.device)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full
        buffers = self.dist.broadcast_object(buffers)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        self._check_tied(model, tied, "after sharding")
        self.module = self.model = model
        self.optimizer = make_optimizer(model)
        self.units = len(blocks) + 1
        return model

    @staticmethod
    def _check_tied(model: nn.Module, tied: list[tuple[str, str]], when: str) -> None:
        for head, shared in tied:
            if model.get_parameter(head) is not model.get_parameter(shared):
                raise RuntimeError(f"fsdp: the tied weights {head} and {shared} came apart {when}")

    # ------------------------------------------------------------------ one step
    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        # before the last micro-batch, gradients accumulate unsharded without a reduce-scatter
        self.model.set_requires_gradient_sync(last)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    # ------------------------------------------------------------------ state
    def _aliases(self) -> list[str]:
        return [head for head, _ in getattr(self.module, "tied", [])]

    def save(self, directory: Path, state: dict[str, Any], metadata: dict[str, str]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        model_state = ckpt.saved_part(self.module, model_state) if _adapted(self.module) else model_state
        with writing(directory / layout.DCP):
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / layout.DCP))
        if self.dist.is_main:
            marker = {"format": layout.DCP, "world_size": self.dist.world_size, "aliases": self._aliases(),
                      "metadata": {**metadata, **ckpt.model_metadata(self.module)}}
            with writing(directory / layout.STATE):
                torch.save({**state, ckpt.FORMAT_KEY: marker}, directory / layout.STATE)

    def load(self, directory: Path) -> dict[str, Any]:
        fmt = layout.checkpoint_format(directory)
        if fmt == layout.DCP:
            return load_sharded(self.module, self.optimizer, directory)
        if fmt == "safetensors":
            return self._load_whole(directory)
        raise UserError(f"checkpoint {directory} holds {fmt or 'no weights'} ({layout.WEIGHTS} or {layout.DCP}/ "
                        "expected): train.strategy=fsdp cannot resume it; start a new run from its weights "
                        "with init=DIR, or resume it with the strategy that wrote it")

    def _load_whole(self, directory: Path) -> dict[str, Any]:
        """A checkpoint of ``single`` or ``ddp`` (one weights file, the optimizer state in ``state.pt``,
        by parameter index): read on the main rank, each rank takes its shards."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        weights: dict[str, torch.Tensor] = {}
        optimizer: dict[str, Any] = {}
        outcome: tuple[str, Any] = ("ok", None)
        if self.dist.is_main:
            try:
                ckpt.check_adapter_base(self.module, directory / layout.WEIGHTS)
                weights = ckpt.read_weights(directory / layout.WEIGHTS, merge_adapters=False)
                state = ckpt.load_state(directory)
                optimizer = _by_name(self.module, self.optimizer, state.pop("optimizer"))
                ckpt.load_weights(self.module, weights, str(directory), check_only=True)
                outcome = ("ok", state)
            except UserError as e:
                outcome = ("error", str(e))
        outcome = self.dist.broadcast_object(outcome)
        if outcome[0] == "error":
            raise UserError(outcome[1])
        weights = self._completed(weights)
        for head, shared in getattr(self.module, "tied", []):
            if shared in weights:
                weights[head] = weights[shared]
        # two calls: set_state_dict skips the model on ranks given an empty model state dict
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.module, weights, options=options)
        set_optimizer_state_dict(self.module, self.optimizer, optimizer, options=options)
        return outcome[1]

    def _completed(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A LoRA model's saved tensors (main rank) completed with the frozen base weights it holds, so
        that a whole-model state dict is broadcast; ``tensors`` as they are otherwise. Every rank calls."""
        if not _adapted(self.module):
            return tensors
        current = self.full_state_dict()
        if current is None:  # not the main rank: it receives the main rank's broadcast
            return tensors
        return {**current, **tensors}

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        tensors = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return tensors if self.dist.is_main else None

    def load_full_state_dict(self, tensors: dict[str, torch.Tensor] | None) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        problem = None
        tensors = self._completed(dict(tensors or {}) if self.dist.is_main else {})  # a LoRA model's adapters
        if self.dist.is_main:
            for head, shared in getattr(self.module, "tied", []):
                if head not in tensors and shared in tensors:
                    tensors[head] = tensors[shared]
            expected = {k: tuple(v.shape) for k, v in self.module.state_dict().items()}
            missing = sorted(set(expected) - set(tensors))
            unexpected = sorted(set(tensors) - set(expected))
            shapes = sorted(k for k in expected if k in tensors and tuple(tensors[k].shape) != expected[k])
            if missing or unexpected or shapes:
                problem = (f"the weights to load do not match the model: missing {missing[:4]}, unexpected "
                           f"{unexpected[:4]}, mis-shaped {shapes[:4]}")
        problem = self.dist.broadcast_object(problem)
        if problem is not None:
            raise UserError(problem)
        set_model_state_dict(self.module, tensors if self.dist.is_main else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def load_sharded(module: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> dict[str, Any]:
    """Model and optimizer state from the ``dcp/`` checkpoint in ``directory`` into ``module`` (sharded by
    FSDP, or whole: ``single`` and ``ddp`` resume an fsdp checkpoint through this) and its optimizer,
    resharded for this world size; returns the trainer's state. Every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    state = ckpt.load_state(directory)
    state.pop(ckpt.FORMAT_KEY, None)
    ckpt.check_adapter_base(module, directory)
    model_state, optim_state = get_state_dict(module, optimizer)
    adapted = _adapted(module)
    if adapted:  # a LoRA run's checkpoint holds its adapters (and trained heads); the base is loaded already
        model_state = ckpt.saved_part(module, model_state)
    ckpt.load_dcp({"model": model_state, "optim": optim_state}, directory)
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=StateDictOptions(strict=not adapted))
    return state


def _adapted(module: nn.Module) -> bool:
    """Whether ``module`` carries LoRA adapters (:mod:`pentad.training.lora`): its checkpoints hold only
    what trains."""
    return getattr(module, "lora", None) is not None


def _by_name(module: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """A ``torch.optim`` state dict (parameters by index, as ``single`` saves it) with the parameters'
    names instead, as ``torch.distributed.checkpoint.state_dict`` takes it. The index order is the
    optimizer's: the same grouping of the same parameters whatever the strategy."""
    names = {id(p): n for n, p in module.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    count = sum(len(g["params"]) for g in saved.get("param_groups", []))
    if count != len(order) or len(saved["param_groups"]) != len(optimizer.param_groups):
        raise UserError(f"the checkpoint's optimizer state has {count} parameters in "
                        f"{len(saved.get('param_groups', []))} groups, this model's optimizer {len(order)} in "
                        f"{len(optimizer.param_groups)}: was it trained with another config?")
    return {"state": {order[int(i)]: value for i, value in saved["state"].items()},
            "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]}


def _to_meta(model: nn.Module) -> None:
    """Move ``model``'s parameters and buffers to the meta device, keeping shared parameters shared
    (``Module.to`` makes a new parameter per module when the device type changes)."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():  # noqa: SLF001 - where the module keeps them
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    model.to("meta")
    for places in owners.values():
        first, first_name = places[0]
        for module, name in places[1:]:
            setattr(module, name, getattr(first, first_name))
