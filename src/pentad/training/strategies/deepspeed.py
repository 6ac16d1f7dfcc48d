"""``deepspeed``: DeepSpeed ZeRO (stage 1, 2 or 3, optionally with CPU offload) around pentad's own
model, optimizer and learning-rate schedule.

DeepSpeed is an optional extra (``pip install 'pentad[deepspeed]'``), imported only when this
strategy is used. The engine's config is built from ``train.*`` (see :func:`build_config`); a
DeepSpeed JSON named by ``train.deepspeed.config`` adds the engine settings pentad has no key for,
and may repeat pentad's values (or say ``"auto"``) but not contradict them.

Every rank builds the same seeded model (``sharded = False``) and ZeRO partitions it when the
engine is made. The optimizer is pentad's AdamW (a DeepSpeed "client optimizer": no JIT-compiled
op), stepped by ZeRO on each rank's partition; the trainer's schedule sets the learning rate of its
parameter groups, which ZeRO steps with. Gradient accumulation follows the trainer: each
micro-batch's loss comes already divided by ``train.grad_accum``, the engine is told which
micro-batch ends a step (``set_gradient_accumulation_boundary``) and steps once per optimizer step.

Checkpoints are DeepSpeed's own (``deepspeed/`` in the checkpoint directory: model states and each
rank's optimizer partition, checked before DeepSpeed unpickles them) beside pentad's ``state.pt``
(step, data position, schedule, RNG); :mod:`pentad.training.zero_checkpoint` reads them, and
consolidates one into a single state dict for ``pentad export`` (DeepSpeed's ``zero_to_fp32``).
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pentad import layout
from pentad.errors import UserError, writing
from pentad.files import temporary_dir
from pentad.training import checkpoint as ckpt
from pentad.training import zero_checkpoint as zero
from pentad.training.strategies.base import STRATEGIES, OptimizerFactory, Strategy

if TYPE_CHECKING:
    from pentad.training.config import TrainConfig
    from pentad.training.distributed import Dist

# ------------------------------------------------------------------------------ the engine's config
_ABSENT = object()


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def read_user_config(path: str | Path) -> dict[str, Any]:
    """A DeepSpeed JSON file as a dict; a clear UserError when it is missing or not a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"train.deepspeed.config={path}: no such file (a DeepSpeed JSON config)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"train.deepspeed.config={path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                        f"{e.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"train.deepspeed.config={path}: expected a JSON object (DeepSpeed's config), found "
                        f"{type(data).__name__}")
    return data


def build_config(cfg: TrainConfig, world_size: int, user: dict[str, Any] | None = None,
                 source: str = "") -> dict[str, Any]:
    """DeepSpeed's config for ``cfg`` (a TrainConfig) on ``world_size`` data-parallel ranks.

    pentad fills the batch size, accumulation, clipping, precision and ZeRO settings from ``train.*``.
    ``user`` (read from ``source``, ``train.deepspeed.config``) adds everything else; where it has a
    key pentad fills, the value must be pentad's or ``"auto"``, else a UserError names the key, the
    file, both values and the ``train.*`` key to change. Its ``optimizer`` and ``scheduler``
    sections are refused: pentad's optimizer and schedule (``train.lr``, ``train.schedule``, ...) are
    the ones used.
    """
    ds = cfg.deepspeed
    offload_parameters = ds.offload_parameters and ds.stage == 3
    # (DeepSpeed key, pentad's value, the train.* key that sets it, the values of the file that agree)
    filled: list[tuple[str, Any, str, tuple[Any, ...]]] = [
        ("train_batch_size", cfg.batch_size * cfg.grad_accum, "train.batch_size (x train.grad_accum)", ()),
        ("train_micro_batch_size_per_gpu", cfg.batch_size // world_size,
         f"train.batch_size (the global micro-batch; / {world_size} process(es))", ()),
        ("gradient_accumulation_steps", cfg.grad_accum, "train.grad_accum", ()),
        ("gradient_clipping", cfg.clip_grad_norm or 0.0, "train.clip_grad_norm", ()),
        ("bf16.enabled", cfg.precision == "bf16", "train.precision", ()),
        ("fp16.enabled", cfg.precision == "fp16", "train.precision", ()),
        ("zero_optimization.stage", ds.stage, "train.deepspeed.stage", ()),
        ("zero_optimization.offload_optimizer.device", "cpu" if ds.offload_optimizer else "none",
         "train.deepspeed.offload_optimizer", ("cpu", "nvme") if ds.offload_optimizer else (None,)),
        ("zero_optimization.offload_param.device", "cpu" if offload_parameters else "none",
         "train.deepspeed.offload_parameters", ("cpu", "nvme") if offload_parameters else (None,)),
    ]
    config = copy.deepcopy(user) if user else {}
    where = f"the DeepSpeed config {source}" if source else "the DeepSpeed config"
    for section, keys in (("optimizer", "train.lr, train.betas, train.eps, train.weight_decay, "
                                        "train.adam_bias_correction"),
                          ("scheduler", "train.schedule and train.warmup")):
        if section in config:
            raise UserError(f"{where} has an {section!r} section: pentad trains with its own optimizer and "
                            f"learning-rate schedule (set by {keys}); remove {section!r} from the file")
    for key, value, train_key, agree in filled:
        found = _get(config, key)
        accepted = (value, "auto", *agree)
        if found is not _ABSENT and found not in accepted and not (
                isinstance(found, (int, float)) and not isinstance(found, bool) and found == value):
            raise UserError(f"{where} sets {key}={json.dumps(found)}, but pentad's config gives "
                            f"{json.dumps(value)} (from {train_key}): remove the key from the file, set it to "
                            f"\"auto\", or change {train_key.split(' ')[0]} to match")
        if found is _ABSENT or found == "auto" or found is None:
            _set(config, key, value)
    if _get(config, "zero_optimization.offload_optimizer.device") == "none":
        config["zero_optimization"].pop("offload_optimizer")
    if _get(config, "zero_optimization.offload_param.device") == "none":
        config["zero_optimization"].pop("offload_param")
    # pentad's optimizer is a torch one (a "client optimizer"): allowed with ZeRO, and with offload,
    # where DeepSpeed would otherwise insist on its own DeepSpeedCPUAdam
    config.setdefault("zero_allow_untested_optimizer", True)
    if ds.offload_optimizer:
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    config.setdefault("steps_per_print", 2 ** 62)  # pentad logs the steps
    return config


# ------------------------------------------------------------------------------ the strategy
@STRATEGIES.register("deepspeed")
class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO over every rank of a torchrun or deepspeed launch (see the module docstring)."""

    needs_launcher = True
    skips_nonfinite = False  # the engine steps itself (train.on_nonfinite=skip is refused)
    precisions = ("fp32", "tf32", "bf16", "fp16")
    precision_note = ("; DeepSpeed's bf16 keeps fp32 master weights in the optimizer (train.precision=bf16), and "
                      "bf16 weights without them are not one of its modes")

    def __init__(self, cfg: TrainConfig, dist: Dist):
        super().__init__(cfg, dist)
        self.engine: Any = None
        self.deepspeed: Any = None
        self.config: dict[str, Any] = {}
        # bf16 and fp16 are DeepSpeed's own (16-bit weights and gradients, fp32 master weights in the
        # optimizer; fp16 with its dynamic loss scaling): the trainer does not add torch.autocast on top
        self.autocast = False

    @classmethod
    def check_installed(cls) -> None:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise UserError(f"train.strategy=deepspeed needs the DeepSpeed package, which is not installed: "
                            f"{zero.INSTALL_HINT} (then launch with torchrun or the deepspeed launcher)")

    # ------------------------------------------------------------------ placement
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> nn.Module:
        deepspeed = self.deepspeed = zero.import_deepspeed(self.device)
        _quiet_deepspeed(deepspeed, self.dist.is_main)
        user, source = None, ""
        if self.cfg.deepspeed.config:
            source = str(self.cfg.deepspeed.config)
            user = read_user_config(source)
        self.config = build_config(self.cfg, self.dist.world_size, user, source)
        if self.cfg.deepspeed.offload_optimizer and self.dist.is_main and self.device.type == "cuda":
            print("train.deepspeed.offload_optimizer: pentad's torch AdamW steps the offloaded optimizer state on "
                  "the CPU; DeepSpeed's DeepSpeedCPUAdam (an 'optimizer' section in a DeepSpeed config, not "
                  "offered here) would be faster", file=sys.stderr)
        if self.cfg.deepspeed.stage == 3:
            _trace_dataclasses()
        optimizer = make_optimizer(model)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.config,
                                               dist_init_required=False)
        self.engine = engine
        self.model = engine
        self.module = engine.module
        # the torch optimizer ZeRO steps on each rank's partition: the trainer's schedule sets its
        # groups' learning rates, which are the dicts ZeRO's optimizer reads
        self.optimizer = optimizer
        return self.model

    # ------------------------------------------------------------------ one step
    @contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        self.engine.set_gradient_accumulation_boundary(last)
        yield

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the trainer already divided by grad_accum

    def step(self, clip_grad_norm: float | None, loss_nonfinite: torch.Tensor | None = None
             ) -> torch.Tensor | None:
        # the engine steps itself: its fp16 mode skips overflowing steps, other steps are applied; a
        # non-finite loss is reported (``skipped``) so that train.on_nonfinite=stop stops the run
        self.engine.step()
        self.skipped = None if loss_nonfinite is None else loss_nonfinite.float()
        if clip_grad_norm is None:
            return None
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(norm, dtype=torch.float32).detach()

    # ------------------------------------------------------------------ state
    def save(self, directory: Path, state: dict[str, Any], metadata: dict[str, str]) -> None:
        # a LoRA model's checkpoint holds what trains (adapters, trained heads); its frozen base is init's
        self.engine.save_checkpoint(str(directory / layout.DEEPSPEED), tag=zero.TAG, client_state={}, save_latest=False,
                                    exclude_frozen_parameters=self._adapted)
        if self.dist.is_main:
            with writing(directory, needed=0):
                torch.save({**state, "strategy": "deepspeed", "zero_stage": self.cfg.deepspeed.stage,
                            "weights_metadata": {**metadata, **ckpt.model_metadata(self.module)}},
                           directory / layout.STATE)

    @property
    def _adapted(self) -> bool:
        """Whether the model carries LoRA adapters (:mod:`pentad.training.lora`)."""
        return getattr(self.module, "lora", None) is not None

    def load(self, directory: Path) -> dict[str, Any]:
        state = ckpt.load_state(directory)
        saved_world = int(state.get("world_size", 1))
        if not (directory / layout.DEEPSPEED).is_dir():
            raise UserError(f"checkpoint {directory} was not written by the deepspeed strategy (it has no "
                            f"{layout.DEEPSPEED}/); resume it with the train.strategy it was trained with, or start "
                            f"from its weights: pentad export, then init=")
        # DeepSpeed unpickles its files: the main rank checks first that they hold only tensors and
        # DeepSpeed's own records, and every rank stops with its message otherwise
        problem = None
        if self.dist.is_main:
            try:
                zero.check_files(directory)
            except UserError as e:
                problem = str(e)
        problem = self.dist.broadcast_object(problem)
        if problem:
            raise UserError(problem)
        saved_stage, stage = int(state.get("zero_stage", self.cfg.deepspeed.stage)), self.cfg.deepspeed.stage
        if (saved_stage == 3) != (stage == 3):
            raise UserError(f"checkpoint {directory} was written with ZeRO stage {saved_stage} and this run has stage "
                            f"{stage}: DeepSpeed's checkpoints of stage 3 (partitioned parameters) and of stages 1 "
                            f"and 2 differ; resume with train.deepspeed.stage={saved_stage}, or continue from its "
                            "weights with a fresh optimizer: pentad export RUN OUT, then init=OUT in a new run")
        ckpt.check_adapter_base(self.module, directory)
        if saved_world == self.dist.world_size:
            path, _ = self.engine.load_checkpoint(str(directory / layout.DEEPSPEED), tag=zero.TAG,
                                                  load_module_strict=not self._adapted, load_optimizer_states=True,
                                                  load_lr_scheduler_states=False)
        elif self._adapted:
            raise UserError(f"checkpoint {directory} of a LoRA run was written by {saved_world} process(es): under "
                            f"train.strategy=deepspeed it resumes on as many (this launch has "
                            f"{self.dist.world_size}); or resume it with train.strategy=ddp, which reads it on any "
                            "number")
        else:
            path = self._load_resharded(directory, saved_world)
        if path is None:
            raise UserError(f"DeepSpeed could not load checkpoint {directory / layout.DEEPSPEED} (tag {zero.TAG}); "
                            "it is incomplete")
        for key in ("strategy", "zero_stage", "weights_metadata"):
            state.pop(key, None)
        return state

    def _load_resharded(self, directory: Path, saved_world: int) -> Any:
        """Load a checkpoint written by another number of processes: DeepSpeed's universal checkpoint
        (each parameter's fp32 value and optimizer state whole, ``ds_to_universal``), made by the main
        rank in a temporary directory beside the checkpoint, then read into this launch's partitions."""
        import shutil

        staged = None
        if self.dist.is_main:
            staged = str(temporary_dir(directory.parent, f".{directory.name}.universal."))
            try:
                zero.to_universal(directory, Path(staged) / zero.UNIVERSAL_TAG)
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)
                raise
        staged = self.dist.broadcast_object(staged)
        try:
            self.engine._config.load_universal_checkpoint = True  # noqa: SLF001 - DeepSpeed's switch for this load
            path, _ = self.engine.load_checkpoint(staged, tag=zero.UNIVERSAL_TAG, load_module_strict=True,
                                                  load_optimizer_states=True, load_lr_scheduler_states=False)
            # DeepSpeed 0.19's ZeRO-3 universal load gives every partition the same step tensor, which a
            # torch AdamW then advances once per partition: each its own, as after a normal load
            for values in self.optimizer.state.values():
                if isinstance(values.get("step"), torch.Tensor):
                    values["step"] = values["step"].clone()
        finally:
            self.engine._config.load_universal_checkpoint = False  # noqa: SLF001
            self.dist.barrier()
            if self.dist.is_main:
                shutil.rmtree(staged, ignore_errors=True)
        if self.dist.is_main:
            print(f"resharded the DeepSpeed checkpoint of {saved_world} process(es) for {self.dist.world_size} "
                  "(DeepSpeed's universal checkpoint)", file=sys.stderr)
        return path

    def _full_parameters(self) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        """Every parameter of the module with its whole fp32 value (ZeRO's master weights; every
        rank calls: the partitions are gathered)."""
        from deepspeed.utils import safe_get_full_fp32_param

        stage3 = self.cfg.deepspeed.stage == 3
        for param in self.module.parameters():
            full = safe_get_full_fp32_param(param)
            if full is None:  # not trained (no master copy): the module's own value
                if stage3:
                    with self.deepspeed.zero.GatheredParameters([param]):
                        full = param.detach().clone()
                else:
                    full = param.detach()
            yield param, full

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        values: dict[int, torch.Tensor] = {}
        for param, full in self._full_parameters():
            if self.dist.is_main:
                values[id(param)] = full.detach().to("cpu", torch.float32).clone()
        if not self.dist.is_main:
            return None
        out = {}
        for name, value in self.module.state_dict(keep_vars=True).items():
            if id(value) in values:
                out[name] = values[id(value)]
            else:  # a buffer (not partitioned); floating ones as fp32, as the model built them
                tensor = value.detach().to("cpu")
                out[name] = tensor.float() if tensor.is_floating_point() else tensor.clone()
        return out

    def load_full_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param

        own = self.module.state_dict(keep_vars=True)
        adapters = getattr(self.module, "lora", None)  # a LoRA model: its frozen base is loaded already
        missing = [k for k in own if k not in tensors and not any(k == a for a, _ in getattr(self.module, "tied", []))
                   and (adapters is None or k in adapters.saved)]
        if missing:
            raise UserError(f"the best model's weights lack {', '.join(missing[:4])}"
                            + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
        stage3 = self.cfg.deepspeed.stage == 3
        done: set[int] = set()
        with torch.no_grad():
            for name, value in own.items():
                if name not in tensors or id(value) in done:
                    continue
                done.add(id(value))
                source = tensors[name]
                if isinstance(value, nn.Parameter):
                    safe_set_full_fp32_param(value, source.to(self.device, torch.float32))  # the master copy
                    if stage3:  # the module's partitions, from the main rank's whole value
                        with self.deepspeed.zero.GatheredParameters([value], modifier_rank=0):
                            if self.dist.is_main:
                                value.data.copy_(source.to(value.device, value.dtype))
                        continue
                value.data.copy_(source.to(value.device, value.dtype))

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "destroy"):
            try:
                self.engine.destroy()
            except Exception:  # noqa: BLE001 - releasing hooks only; the process group is the session's
                pass
        self.engine = None


def _trace_dataclasses() -> None:
    """Let ZeRO-3 find the tensors inside pentad's dataclasses (``Batch``, ``Embedded``,
    ``TargetOutput``) that modules take and return.

    ZeRO-3 gathers a module's partitioned parameters again for its backward from autograd hooks
    it puts on the tensors of the module's inputs and outputs; it looks inside tuples, lists and
    dicts (Hugging Face's outputs are dicts) but not dataclasses, and without those hooks backward
    fails ("active_backward_submodules is empty"). Its traversal function is extended to treat a
    dataclass as a shallow copy with each field traversed; everything else goes to DeepSpeed's own.
    """
    import dataclasses

    from deepspeed.runtime.zero import parameter_offload, utils

    original = utils.apply_to_tensors_only
    if getattr(original, "pentad_dataclasses", False):
        return

    def apply_to_tensors_only(function, value, warning_msg_fn=None):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out = copy.copy(value)
            for f in dataclasses.fields(value):
                object.__setattr__(out, f.name, apply_to_tensors_only(function, getattr(value, f.name),
                                                                      warning_msg_fn))
            return out
        return original(function, value, warning_msg_fn)

    apply_to_tensors_only.pentad_dataclasses = True  # type: ignore[attr-defined]
    # both names: DeepSpeed's hooks call the one in parameter_offload, its recursion the one in utils
    utils.apply_to_tensors_only = apply_to_tensors_only
    parameter_offload.apply_to_tensors_only = apply_to_tensors_only


def _quiet_deepspeed(deepspeed: Any, main: bool) -> None:
    """DeepSpeed logs its config and engine details at INFO on every rank: warnings only, and on
    the main rank only (the others keep errors)."""
    import logging

    deepspeed.utils.logger.setLevel(logging.WARNING if main else logging.ERROR)
    # DeepSpeed 0.19 calls collectives that torch 2.13 deprecates, once per call site
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
                            "is deprecated", category=FutureWarning)
