"""One Trainer with one generic step, for pre-training and fine-tuning alike.

Objective-specific work lives in objectives (data -> Batch) and targets (hidden -> loss); the
trainer only sums target losses, accumulates gradients, clips, steps, logs and checkpoints. What some
runs add is a :class:`Hook` the session or the runner registers: evaluation with a best model and early
stopping is one (:mod:`pentad.training.evaluation`); adversarial training is one the trainer makes from
its config (:class:`AdversarialTraining`). When to save is :class:`SaveSchedule`'s decision.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pentad import files, layout
from pentad.components.base import Batch, ModelOutput
from pentad.errors import Diverged, Interrupted, RankFailure, UserError
from pentad.layers.moe import MoE
from pentad.model import aux_loss, total_loss
from pentad.training import checkpoint as ckpt
from pentad.training.adversarial import Adversary
from pentad.training.compiled import compile_model
from pentad.training.config import TrainConfig
from pentad.training.distributed import Dist, describe_failure, pick_device
from pentad.training.optim import build_optimizer, build_schedule
from pentad.training.precision import (
    apply_matmul_precision,
    autocast_dtype,
    describe,
    model_flops_per_token,
    peak_memory_gib,
    peak_tflops,
    resolve,
    synchronize,
)
from pentad.training.progress import ProgressBar, ProgressLines, RunEstimate, make_progress
from pentad.training.recompute import checkpoint_blocks
from pentad.training.strategies.base import Strategy
from pentad.training.strategies.single import SingleStrategy

BatchStream = Callable[[int], Iterator[Batch]]  # start micro-batch index -> batches from there


def batch_tokens(batch: Batch) -> torch.Tensor:
    """Number of real (non-padding) tokens in a batch, as a tensor (no host sync)."""
    ref = batch.tokens if batch.tokens is not None else batch.decoder_tokens
    if ref is None:
        return torch.tensor(batch.batch_size)
    if batch.padding_mask is None:
        return torch.tensor(ref.numel(), device=ref.device)
    return (~batch.padding_mask).sum()


def _add(sums: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    """Add ``value`` (detached, as float32) to ``sums[key]``, or start it."""
    value = value.detach().float()
    sums[key] = sums[key] + value if key in sums else value


class MetricsLog:
    """Appends one JSON object per logging interval to ``metrics.jsonl``."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def reset(self) -> None:
        """A run starting at step 0: forget the records of an earlier attempt that never saved."""
        if self.path.is_file():
            files.atomic_write_text(self.path, "")

    def truncate_after(self, step: int) -> None:
        """On resume, forget intervals logged after the checkpoint (they will be redone)."""
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        files.atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))




class EventLog:
    """The scalars of ``metrics.jsonl`` as TensorBoard event files in the run directory, so that
    ``tensorboard --logdir runs`` shows every run. Training records become ``train/<key>``, dev
    evaluations ``dev/<metric>``. ``writer`` is anything with ``add_scalar(tag, value, step)``,
    ``flush()`` and ``close()``; by default a ``torch.utils.tensorboard.SummaryWriter``, opened on
    the first record (a resumed run asks TensorBoard to drop the old files' events from its step on).
    Without the ``tensorboard`` package nothing is written, after one line saying so.
    """

    def __init__(self, run_dir: Path, enabled: bool, writer: Any = None):
        self.run_dir = run_dir
        self.enabled = enabled
        self.writer = writer
        self.start_step = 0

    def reset(self) -> None:
        """A run starting at step 0: remove the event files of an earlier attempt."""
        for path in self.run_dir.glob(layout.EVENTS_GLOB):
            path.unlink(missing_ok=True)

    def open(self, start_step: int) -> None:
        """Start logging at ``start_step`` (the writer itself is made with the first record)."""
        self.start_step = start_step

    def _make_writer(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard (or one of its dependencies) is not installed
            self.enabled = False
            print("TensorBoard event files are not written: the tensorboard package is not installed "
                  "(pip install 'pentad[tensorboard]'; train.tensorboard=false turns this line off)", file=sys.stderr)
            return
        self.writer = SummaryWriter(str(self.run_dir), purge_step=self.start_step or None)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled and self.writer is None:
            self._make_writer()
        if self.writer is None:
            return
        step = int(record["step"])
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            tag = f"dev/{key[len('dev_'):]}" if key.startswith("dev_") else f"train/{key}"
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _plain(value: Any) -> Any:
    """A config value as JSON-friendly data (tuples as lists, paths as strings)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class StopRequest:
    """Turns SIGINT and SIGTERM into a request to stop at the next step boundary.

    The first signal only sets ``signum`` (the loop saves a checkpoint and stops); a second SIGINT
    raises KeyboardInterrupt at once, without saving. Handlers are installed only in the main thread
    (Python delivers signals there) and put back by ``restore``.
    """

    def __init__(self) -> None:
        self.signum = 0
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        # os.write, not print: a handler that prints while the interrupted code prints can raise
        # "reentrant call" in the buffered stderr
        os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint "
                    "(Ctrl-C again stops at once, without saving)\n".encode())

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}


class Hook:
    """An optional behaviour of the training loop; every method does nothing by default.

    Every rank calls the same hooks at the same steps, and a hook's decisions must be alike on every
    rank (computed from values every rank shares), or the ranks would part ways.
    """

    def on_start(self, trainer: Trainer) -> None:
        """Called once before the first step of :meth:`Trainer.train` (``trainer.step`` is where the run
        starts: 0, or the resumed checkpoint's step)."""

    def before_forward(self, trainer: Trainer, batch: Batch) -> None:
        """Called with each micro-batch (this rank's rows, on the device) before its forward."""

    def transform(self, trainer: Trainer, outputs: dict[str, Any], batch: Batch) -> dict[str, Any]:
        """The heads' outputs of a forward of ``batch`` (under autocast), changed before their losses are
        summed (distillation mixes soft-label losses in); every forward of the micro-batch passes here,
        those of a hook's :meth:`backward` too. Returns them unchanged by default."""
        return outputs

    def around_backward(self, trainer: Trainer, batch: Batch) -> AbstractContextManager[Any]:
        """A context the micro-batch's own forward and backward run in (adversarial training keeps the
        gradient that backward gives the tables it perturbs); by default nothing."""
        return nullcontext()

    #: True when :meth:`backward` adds a backward pass of its own to every micro-batch
    adds_backward: bool = False

    def backward(self, trainer: Trainer, loss_of: Callable[[nn.Module], torch.Tensor],
                 reduce: bool) -> dict[str, torch.Tensor]:
        """With ``adds_backward``: a backward pass after the micro-batch's own (and after those of the hooks
        before it), whose gradients add to the step's (adversarial training's perturbed loss).
        ``loss_of(module)``: the micro-batch's loss through ``module``, computed as the loop computes its
        own (``trainer.forward_model`` for gradients that count, ``trainer.model`` for others).
        ``reduce``: this backward is the one that reduces gradients across ranks (the last backward of a
        step's last micro-batch); run it under ``trainer.strategy.accumulate(last=reduce)``. Returns
        detached ``<name>_loss`` values, summed over the logging interval and logged as means per
        micro-batch like the heads' losses (other values are :meth:`on_log`'s)."""
        return {}

    def on_log(self, trainer: Trainer) -> dict[str, Any]:
        """Values this hook adds to each logged record of ``metrics.jsonl`` (after ``lr``), at the step just
        done (``trainer.step``); on every rank, at the logging steps only."""
        return {}

    def after_step(self, trainer: Trainer, done: bool) -> bool:
        """Called after each optimizer step, once that step's metrics are logged and before its checkpoint
        (``done``: the step is the run's last). Returns True to stop training after this step, with a
        checkpoint (early stopping)."""
        return False


class AdversarialTraining(Hook):
    """``train.adversarial`` (:mod:`pentad.training.adversarial`): after each micro-batch's backward, the
    backward of its loss with the embedding tables perturbed, logged as ``adv_loss``. The trainer adds it
    to its own hooks when the config asks for it."""

    adds_backward = True

    def __init__(self, adversary: Adversary):
        self.adversary = adversary

    def around_backward(self, trainer: Trainer, batch: Batch) -> AbstractContextManager[Any]:
        return self.adversary.capture()

    def backward(self, trainer: Trainer, loss_of: Callable[[nn.Module], torch.Tensor],
                 reduce: bool) -> dict[str, torch.Tensor]:
        return {"adv_loss": self.adversary.attack(loss_of, reduce)}


class ExpertBiasUpdate(Hook):
    """Auxiliary-loss-free load balancing (``moe.bias_update_rate``, DeepSeek-V3): after every optimizer step
    each mixture of experts with a rate moves its choice bias from the assignments its training forwards
    counted (:meth:`~pentad.layers.moe.MoE.update_choice_bias`), the counts summed over the ranks first (one
    all-reduce for every layer together), so that every rank applies the same update. The trainer adds it
    to its own hooks when the model has such a layer."""

    def __init__(self, layers: list[MoE]):
        self.layers = layers

    def after_step(self, trainer: Trainer, done: bool) -> bool:
        loads = trainer.dist.all_reduce(torch.cat([layer.expert_load for layer in self.layers
                                                   if layer.expert_load is not None]))
        for layer, load in zip(self.layers, loads.split([layer.num_experts for layer in self.layers])):
            layer.update_choice_bias(load)
        return False


class SaveSchedule:
    """When the loop saves a checkpoint: every ``every`` steps (``train.save_every``), once ``minutes``
    (``train.save_minutes``) have passed since the last save or the start, and at the run's last step.
    Each rank reads the time on its own clock (:meth:`timed`); the loop agrees on it across the ranks
    before it asks :meth:`due`."""

    def __init__(self, every: int | None, minutes: float | None):
        self.every = every
        self.minutes = minutes
        self.last = time.monotonic()

    def timed(self) -> bool:
        """Whether ``minutes`` have passed since the last save (on this rank's clock)."""
        return self.minutes is not None and time.monotonic() - self.last >= 60 * self.minutes

    def due(self, step: int, done: bool, timed: bool) -> bool:
        """Whether to save after ``step`` (``done``: the run's last step; ``timed``: as the ranks agreed)."""
        return bool(self.every and step % self.every == 0) or done or timed

    def saved(self) -> None:
        self.last = time.monotonic()


class Interval:
    """What the loop gathers between two logged records, on the device (no host sync): the sums of the
    losses and metrics, the real tokens trained on and the steps done; when the interval started, and
    the last micro-batch's sequence length (for the model FLOPs)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seq_len = 0
        self.restart()

    def restart(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.tokens = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps = 0
        synchronize(self.device)
        self.start = time.perf_counter()


class Trainer:
    """Trains a model for ``total_steps`` optimizer steps on batches from a ``BatchStream``, through a
    :class:`~pentad.training.strategies.base.Strategy` (one process, or every rank of a launch).

    The stream yields *global* micro-batches (``train.batch_size`` rows), the same whatever the world
    size; each rank trains on its share of the rows, and each target's loss is weighted by the rank's
    share of that target's items (tokens or examples), so a step's gradient is the one a single
    process computes on the whole batch.

    Optional behaviours are hooks (:class:`Hook`) given to :meth:`train`: evaluation
    with a best model and early stopping is :class:`~pentad.training.evaluation.Evaluation`, which calls
    :meth:`evaluate` (its metrics are logged) and may stop training after a step (with a checkpoint).
    ``hooks`` holds those the trainer makes from its config, run before them: ``train.adversarial`` is
    :class:`AdversarialTraining` (an adversarial forward and backward for each micro-batch).
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig, run_dir: Path, total_steps: int,
                 strategy: Strategy | None = None, weights_metadata: dict[str, str] | None = None,
                 description: str = "train", schedule_steps: float | None = None):
        if strategy is None:  # one process, as a library caller builds it
            strategy = SingleStrategy(cfg, Dist(device=pick_device(cfg.device)))
        self.strategy = strategy
        self.dist = strategy.dist
        self.device = strategy.device
        self.cfg = cfg
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.description = description
        self.metadata = weights_metadata or {}
        if cfg.activation_checkpointing and not checkpoint_blocks(model):
            raise UserError("train.activation_checkpointing=true, but this model has no repeated blocks to "
                            "recompute (its encoder has no layers: an RNN or bag-of-words encoder); set it to false")
        if cfg.compile != "off":
            if cfg.strategy in ("fsdp", "deepspeed"):
                raise UserError(f"train.compile={cfg.compile} with train.strategy={cfg.strategy} is not supported "
                                "yet (compiled blocks are tested on one process and under ddp); set train.compile=off")
            compiled = compile_model(model, cfg.compile)
            if self.dist.is_main:
                what = "the model" if cfg.compile == "model" else f"{compiled} block{'s' * (compiled != 1)}"
                print(f"compile: {what} with torch.compile; the first steps of each input shape are slow while "
                      "they compile", file=sys.stderr)
        if cfg.on_nonfinite == "skip" and not strategy.skips_nonfinite:
            raise UserError(f"train.on_nonfinite=skip is not offered with train.strategy={cfg.strategy}: the engine "
                            "applies every step itself (its fp16 mode skips overflowing gradients on its own); use "
                            "train.on_nonfinite=stop")
        self.precision = resolve(cfg.precision, self.device)
        strategy.set_precision(self.precision)
        apply_matmul_precision(self.precision, self.device)
        if self.dist.is_main:
            print(describe(cfg.precision, self.precision, self.device), file=sys.stderr)
        # model FLOPs per token (6 N, 12 L H; times the sequence length) and the peak they are compared with
        self.flops_per_token = model_flops_per_token(model)
        self.peak_tflops = peak_tflops(self.precision, self.device, cfg.peak_tflops)
        self.forward_model = strategy.setup(model, lambda m: build_optimizer(m, cfg))
        self.optimizer = strategy.optimizer
        self.hooks: list[Hook] = []  # the optional behaviours the config asks for, run before those of train()
        if cfg.adversarial.method != "none":
            adversary = Adversary(cfg.adversarial, strategy, cfg.grad_accum)
            if self.dist.is_main:
                print(adversary.describe(), file=sys.stderr)
            self.hooks.append(AdversarialTraining(adversary))
        balancing = [m for m in model.modules() if isinstance(m, MoE) and m.expert_load is not None]
        if balancing:
            self.hooks.append(ExpertBiasUpdate(balancing))
        # schedule_steps: the length the learning-rate schedule counts when it is not the steps run
        # (train.schedule_convention=tencentpretrain in fine-tuning: int(examples x epochs / batch) + 1)
        self.schedule = build_schedule(self.optimizer, cfg, total_steps, schedule_steps)
        # the configured hyper-parameters of each group, re-applied over a loaded checkpoint's
        self._configured = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.log = MetricsLog(run_dir / layout.METRICS)
        self.events = EventLog(run_dir, cfg.tensorboard and self.dist.is_main)
        self.step = 0
        self.micro_batches = 0  # the data position: (global) micro-batches consumed
        self.stopped_early = False  # a hook asked to stop (fine-tuning's early stopping)
        # the progress display of the running loop (messages are written through it)
        self._bar: ProgressBar | ProgressLines | None = None
        self._hooks: Sequence[Hook] = ()  # the running loop's hooks
        self._pointer_problem: str | None = None  # what was wrong with checkpoints/latest (resume)
        # non-finite steps, counted on the device (read at logging, evaluation and saving: no sync per step):
        # the step counter, the first non-finite step, the current and the longest run of them in a row
        self._nonfinite: dict[str, torch.Tensor] = {}

    @property
    def model(self) -> nn.Module:
        """The pentad model itself (unwrapped), for evaluation."""
        return self.strategy.module

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint (the strategy adds weights and optimizer state).
        Every rank calls it (the RNG states of all ranks are gathered)."""
        state: dict[str, Any] = {
            "step": self.step,
            "micro_batches": self.micro_batches,
            "batch_size": self.cfg.batch_size,
            "schedule": self.schedule.state_dict(),
            "rng_cpu": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        if self.strategy.scaler is not None:
            state["grad_scaler"] = self.strategy.scaler.state_dict()
        if self.dist.world_size > 1:
            state["world_size"] = self.dist.world_size
            state["rng_cpu_ranks"] = self.dist.gather_objects(state["rng_cpu"])
            if "rng_cuda" in state:
                state["rng_cuda_ranks"] = self.dist.gather_objects(state["rng_cuda"].cpu())
        return state

    def save(self) -> Path:
        """Write a checkpoint of the current step (every rank calls; the main rank publishes it). A diverged
        run (:meth:`_check_finite`: non-finite weights, or ``train.on_nonfinite`` says stop) is never saved."""
        self._check_finite(weights=True)
        state = self.state()
        staged = Path(self.dist.broadcast_object(
            str(layout.staging_dir(self.run_dir, self.step)) if self.dist.is_main else None))
        try:
            self.strategy.save(staged, state, self.metadata)
            self.dist.barrier()
            final = ckpt.publish_checkpoint(self.run_dir, self.step, staged, self.cfg.keep_checkpoints) \
                if self.dist.is_main else layout.checkpoint_dir(self.run_dir, self.step)
            self.dist.barrier()
        except BaseException:
            if self.dist.is_main:
                shutil.rmtree(staged, ignore_errors=True)
            raise
        return final

    def _choose_checkpoint(self) -> tuple[Path | None, list[int]]:
        """The checkpoint to resume from, decided on the main rank and shared with the others."""
        choice: dict[str, Any] = {}
        if self.dist.is_main:
            wanted = self.cfg.resume_from
            available = layout.checkpoint_steps(self.run_dir)
            choice["available"] = available
            if wanted is not None and wanted not in available:
                kept = ", ".join(map(str, available)) if available else "none"
                choice["error"] = (f"train.resume_from={wanted}: {self.run_dir} has no checkpoint of step {wanted} "
                                   f"(kept checkpoints: {kept}; train.keep_checkpoints sets how many are kept)")
            elif wanted is not None:
                choice["path"] = str(layout.checkpoint_dir(self.run_dir, wanted))
            else:
                latest = layout.latest_checkpoint(self.run_dir)
                choice["path"] = str(latest) if latest is not None else None
                choice["pointer"] = layout.latest_problem(self.run_dir) if latest is not None else None
        choice = self.dist.broadcast_object(choice)
        if "error" in choice:
            raise self.dist.error(choice["error"])
        self._pointer_problem = choice.get("pointer")
        return (Path(choice["path"]) if choice["path"] else None), choice["available"]

    def resume(self, config_changes: dict[str, tuple[Any, Any]] | None = None) -> bool:
        """Continue from the latest checkpoint of the run directory (or from ``train.resume_from``).

        Without a checkpoint the run starts at step 0 and ``metrics.jsonl`` is emptied (records of an
        earlier attempt that never saved would otherwise be repeated). ``config_changes``: settings
        accepted with ``train.allow_changes`` (``key: (old, new)``), recorded in ``metrics.jsonl``.
        """
        wanted = self.cfg.resume_from
        path, available = self._choose_checkpoint()
        if path is None:
            if self.dist.is_main:
                self.log.reset()
                self.events.reset()
            return False
        try:
            state = self.strategy.load(path)
        except UserError as e:
            earlier = [str(s) for s in available if s != int(path.name[len("step-"):])]
            raise UserError(f"{e}. Kept checkpoints: {', '.join(earlier) or 'no other'}; resume from another with "
                            "train.resume_from=STEP") from None
        self.schedule.load_state_dict(state["schedule"])
        if self.strategy.scaler is not None and "grad_scaler" in state:
            self.strategy.scaler.load_state_dict(state["grad_scaler"])
        self._apply_hyperparameters()
        self._restore_rng(state)
        if wanted is not None and self.dist.is_main:  # the later checkpoints belong to the abandoned continuation
            for later in available:
                if later > wanted:
                    shutil.rmtree(layout.checkpoint_dir(self.run_dir, later))
                    print(f"train.resume_from={wanted}: removed the later checkpoint of step {later}", file=sys.stderr)
            files.atomic_write_text(self.run_dir / layout.CHECKPOINTS / layout.LATEST, path.name + "\n")
        elif self._pointer_problem and self.dist.is_main:  # repaired, and said
            print(f"{self._pointer_problem}: resuming from the newest complete checkpoint instead", file=sys.stderr)
            files.atomic_write_text(self.run_dir / layout.CHECKPOINTS / layout.LATEST, path.name + "\n")
        self.step = int(state["step"])
        micro = int(state.get("micro_batches", self.step * self.cfg.grad_accum))
        # the data position counts micro-batches; after an accepted batch-size change, continue
        # after the same number of examples
        self.micro_batches = micro * int(state.get("batch_size", self.cfg.batch_size)) // self.cfg.batch_size
        if self.dist.is_main:
            self.log.truncate_after(self.step)
            print(f"resuming from {path} (step {self.step})", file=sys.stderr)
            if config_changes:
                changed = {k: [_plain(old), _plain(new)] for k, (old, new) in config_changes.items()}
                self.log.write({"step": self.step, "config_changes": changed})
                print("train.allow_changes=true: resuming with changed settings: "
                      + "; ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()), file=sys.stderr)
        self.dist.barrier()
        return True

    def _restore_rng(self, state: dict[str, Any]) -> None:
        """This rank's RNG state as saved; after a change of world size, a fresh seed per rank (the
        random streams of dropout cannot carry over to a different split of the batch)."""
        world, rank = self.dist.world_size, self.dist.rank
        saved_world = int(state.get("world_size", 1))
        if saved_world == world:
            cpu = state["rng_cpu_ranks"][rank] if world > 1 else state["rng_cpu"]
            torch.set_rng_state(cpu)
            cuda = state.get("rng_cuda_ranks", [None] * world)[rank] if world > 1 else state.get("rng_cuda")
            if cuda is not None and self.device.type == "cuda":
                torch.cuda.set_rng_state(cuda, self.device)
            return
        seed = hash((self.cfg.seed, int(state["step"]), rank)) % (2 ** 63)
        torch.manual_seed(seed)
        if self.dist.is_main:
            print(f"resuming {saved_world} process(es)' checkpoint on {world}: the model, optimizer, schedule and "
                  "data position carry over; dropout draws new random numbers", file=sys.stderr)

    def _apply_hyperparameters(self) -> None:
        """After loading a checkpoint, make the optimizer and schedule follow the config (they are the
        checkpoint's values unless a change was accepted; the same values give the same numbers)."""
        for group, configured in zip(self.optimizer.param_groups, self._configured):
            group.update({k: v for k, v in configured.items() if k != "lr"})
        self.schedule.base_lrs = [g["initial_lr"] for g in self._configured]
        for group, base, factor in zip(self.optimizer.param_groups, self.schedule.base_lrs, self.schedule.lr_lambdas):
            group["lr"] = base * factor(self.schedule.last_epoch)
        self.schedule._last_lr = [g["lr"] for g in self.optimizer.param_groups]  # noqa: SLF001 - get_last_lr

    # ------------------------------------------------------------------ loop
    def autocast(self):
        dtype = autocast_dtype(self.precision)
        if dtype is not None and self.strategy.autocast:
            return torch.autocast(self.device.type, dtype=dtype)
        return nullcontext()

    def to_device(self, batch: Batch) -> Batch:
        """The batch on the training device: on a GPU without the padding masks that mark nothing
        (found on the host: no device sync in attention, which then runs without a mask) and through
        pinned host memory with a non-blocking copy (it overlaps the queued work); its float inputs in
        the weights' dtype under bf16-true."""
        if self.device.type == "cuda":
            batch = batch.without_empty_padding().pin_memory()
        return batch.to(self.device, non_blocking=True, dtype=self.strategy.param_dtype)

    def _rank_rows(self, batch: Batch) -> tuple[Batch, float]:
        """This rank's rows of a global micro-batch, and their weight (0 for the stand-in row a rank
        trains on when the batch has fewer rows than there are ranks: the last batch of an epoch)."""
        world = self.dist.world_size
        if world == 1:
            return batch, 1.0
        size = batch.batch_size
        begin, end = size * self.dist.rank // world, size * (self.dist.rank + 1) // world
        if begin == end:
            return batch.rows(torch.zeros(1, dtype=torch.long)), 0.0
        return batch.rows(torch.arange(begin, end)), 1.0

    def _rank_loss(self, outputs: dict[str, Any], rows: int, weight: float
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This rank's share of the global batch's loss, scaled so that averaging the ranks' gradients
        (what every engine does) gives the gradient of each target's mean over the whole global batch:
        ``loss_t * count_t * world / total_count_t``, with the counts of all ranks summed here.
        Returns the loss and each target's scaled share."""
        names = [n for n, out in outputs.items() if out.loss is not None]
        def items(metrics: dict[str, torch.Tensor]) -> torch.Tensor:
            # what the target's loss is a mean over: its "weight" when it says (a per-sequence mean),
            # else its "count" (the positions it scores), else the rows
            value = metrics.get("weight", metrics.get("count"))
            return value.float() if value is not None else torch.tensor(float(rows), device=self.device)

        counts = torch.stack([items(outputs[n].metrics) for n in names]) * weight
        totals = self.dist.all_reduce(counts.detach().clone()).clamp_min(1.0)
        scale = counts * self.dist.world_size / totals
        shares = {n: outputs[n].loss * scale[i] for i, n in enumerate(names)}
        # auxiliary losses (MoE) are means over this rank's tokens: averaging over ranks averages them
        return sum(shares.values()) + aux_loss(outputs), shares

    def _losses(self, model: nn.Module, batch: Batch, weight: float
                ) -> tuple[dict[str, Any], torch.Tensor, dict[str, torch.Tensor] | None]:
        """Forward of ``batch`` through ``model`` under autocast: (outputs, this rank's loss, its
        per-target shares); the outputs pass through each hook's :meth:`Hook.transform` first."""
        with self.autocast():
            outputs = model(batch)
            for hook in self._hooks:
                aux = outputs if isinstance(outputs, ModelOutput) else ModelOutput()
                changed = hook.transform(self, outputs, batch)
                if changed is not outputs and not isinstance(changed, ModelOutput):
                    changed = ModelOutput(changed, aux.aux_losses, aux.aux_metrics)  # the auxiliary losses kept
                outputs = changed
            if self.dist.world_size > 1:
                loss, shares = self._rank_loss(outputs, batch.batch_size, weight)
            else:
                loss, shares = total_loss(outputs), None
        return outputs, loss, shares

    def evaluate(self, evaluate: Callable[[int], dict[str, float]]) -> dict[str, float]:
        """``evaluate(step)`` of the current step (every rank calls; a hook's evaluation), logged as
        ``dev_<metric>``; the model goes back to training mode after it. A diverged model is never
        evaluated (and so never kept as the best)."""
        self._check_finite(weights=True)
        metrics = evaluate(self.step)
        self.forward_model.train()
        if self.dist.is_main and metrics:  # nothing to log where there is no dev set
            self._write({"step": self.step, **{f"dev_{k}": v for k, v in metrics.items()}})
            message = f"step {self.step}: " + ", ".join(f"dev {k} {v:.4f}" for k, v in metrics.items())
            if self._bar is not None:  # with the other progress messages, not into the command's output
                self._bar.write(message)
            else:
                print(message, file=sys.stderr)
        return metrics

    def train(self, stream: BatchStream, hooks: Sequence[Hook] = ()) -> dict[str, Any]:
        """Train to ``total_steps`` (or ``train.stop_at``), saving a checkpoint every ``save_every`` steps,
        every ``save_minutes`` minutes and at the end. SIGINT (Ctrl-C) or SIGTERM stops at the next step
        boundary with a checkpoint and raises :class:`Interrupted`; a second Ctrl-C stops at once.
        With several ranks, the ranks agree on stopping and on timed saves at every step, and a rank
        that fails or dies makes the others stop with :class:`~pentad.errors.RankFailure`.
        ``hooks``: the run's optional behaviours (:class:`Hook`), called in this order after the trainer's
        own (:attr:`hooks`)."""
        try:
            return self._train(stream, hooks)
        except (UserError, Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:
            if self.dist.world_size > 1 and _is_collective_failure(e):
                latest = layout.latest_checkpoint(self.run_dir)
                raise RankFailure(
                    f"rank {self.dist.rank}: the run lost contact with other ranks at step {self.step + 1} "
                    f"({describe_failure(self.dist)}). "
                    + (f"The last checkpoint, {latest}, is intact: run the same command again to resume from it."
                       if latest is not None else "No checkpoint was saved yet.")
                    + f" [{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}]") from None
            raise

    def _train(self, stream: BatchStream, hooks: Sequence[Hook]) -> dict[str, Any]:
        cfg = self.cfg
        hooks = [*self.hooks, *hooks]
        batches = stream(self.micro_batches)
        self.forward_model.train()
        interval = Interval(self.device)
        saves = SaveSchedule(cfg.save_every, cfg.save_minutes)
        last: dict[str, Any] = {}
        bar = make_progress(self.description, self.total_steps, self.step, enabled=cfg.progress and self.dist.is_main,
                            every_s=cfg.progress_every_s, samples_per_step=cfg.batch_size * cfg.grad_accum)
        self._bar, self._hooks = bar, hooks
        stop = StopRequest()
        self.events.open(self.step)
        for hook in hooks:
            hook.on_start(self)
        try:
            end = min(self.total_steps, cfg.stop_at or self.total_steps)
            estimate = RunEstimate(self.step, end) if self.dist.is_main else None
            while self.step < end:
                step_loss = torch.zeros((), device=self.device)
                for micro in range(cfg.grad_accum):
                    step_loss += self._micro_batch(batches, micro == cfg.grad_accum - 1, interval)
                lr = self._optimizer_step(step_loss, interval)
                if estimate is not None:
                    if estimate.needs_sync(self.step):
                        synchronize(self.device)
                    said = estimate.step_done(self.step)
                    if said:
                        bar.write(said)
                done = self.step == end
                signum, timed = self._agreed(stop.signum, saves.timed())
                if self.step % cfg.log_every == 0 or done or signum:
                    last = self._log(interval, lr)
                for hook in hooks:
                    if hook.after_step(self, done):
                        self.stopped_early = done = True  # every rank decides alike (hooks decide on shared values)
                bar.update(self.step, last, done)
                if signum or saves.due(self.step, done, timed):
                    saved = self.save()
                    saves.saved()
                    if signum and not done:
                        raise Interrupted(
                            f"stopped by {signal.Signals(signum).name} after step {self.step} of "
                            f"{self.total_steps}; saved {saved}. Run the same command again to resume from "
                            f"there.", signum)
                if self.stopped_early:
                    break
        finally:
            stop.restore()
            self.events.close()
            bar.close()
            self._bar, self._hooks = None, ()
        return last

    def _micro_batch(self, batches: Iterator[Batch], last: bool, interval: Interval) -> torch.Tensor:
        """The next micro-batch's forward and backward, then the backward passes the hooks add (on the step's
        ``last`` micro-batch, the last backward reduces gradients across ranks); its losses and metrics are
        summed into ``interval``. Returns its loss (detached, float32)."""
        try:
            batch = next(batches)
        except StopIteration:
            raise UserError("the data ran out before the last step") from None
        batch, weight = self._rank_rows(batch)
        batch = self.to_device(batch)
        ref = batch.tokens if batch.tokens is not None else batch.decoder_tokens
        interval.seq_len = ref.shape[-1] if ref is not None else interval.seq_len
        self.micro_batches += 1
        backwards = [hook for hook in self._hooks if hook.adds_backward]
        for hook in self._hooks:
            hook.before_forward(self, batch)
        with self.strategy.accumulate(last=last and not backwards), ExitStack() as around:
            for hook in self._hooks:
                around.enter_context(hook.around_backward(self, batch))
            outputs, loss, shares = self._losses(self.forward_model, batch, weight)
            self.strategy.backward(loss / self.cfg.grad_accum)
        added = [hook.backward(self, lambda module: self._losses(module, batch, weight)[1],
                               last and hook is backwards[-1]) for hook in backwards]
        with torch.no_grad():
            self._accumulate(interval.sums, outputs, loss, weight, shares)
            for hook, values in zip(backwards, added):
                for key, value in values.items():
                    if not key.endswith("_loss"):
                        raise ValueError(f"{type(hook).__name__}.backward returned {key!r}: the values a hook's "
                                         "backward returns are logged as losses, so their names end in '_loss' "
                                         "(other values: Hook.on_log)")
                    _add(interval.sums, key, value)
            if weight:
                interval.tokens += batch_tokens(batch)
        return loss.detach().float()

    def _optimizer_step(self, step_loss: torch.Tensor, interval: Interval) -> float:
        """The optimizer step (left out on every rank alike when the loss of one is not finite), the schedule
        advanced and the step counted; returns the learning rate the step used."""
        loss_nonfinite = (~torch.isfinite(step_loss)).float()
        if self.dist.world_size > 1:  # every rank leaves the step out alike
            self.dist.all_reduce(loss_nonfinite, op="max")
        norm = self.strategy.step(self.cfg.clip_grad_norm, loss_nonfinite)
        if norm is not None:
            interval.sums["grad_norm"] = interval.sums.get("grad_norm", 0) + norm.detach().float()
        if self.strategy.skipped is not None:
            self._count_nonfinite(self.strategy.skipped, interval.sums)
        lr = self.schedule.get_last_lr()[0]
        self.schedule.step()
        self.step += 1
        interval.steps += 1
        return lr

    def _agreed(self, signum: int, timed: bool) -> tuple[int, bool]:
        """A stop signal and a timed save (:meth:`SaveSchedule.timed`) as every rank takes them: each rank
        may catch a signal or reach the time on its own, and all must stop and save at the same step (one
        collective per step with several ranks)."""
        if self.dist.world_size == 1:
            return signum, timed
        agreed_signum, agreed_timed = self.dist.agree_max([float(signum), float(timed)])
        return int(agreed_signum), bool(agreed_timed)

    def _log(self, interval: Interval, lr: float) -> dict[str, Any]:
        """The interval's record (computed on every rank, written by the main rank), the check that the run
        has not diverged (``train.on_nonfinite``), and a new interval."""
        record = self._record(interval.sums, interval.steps, interval.tokens, interval.start, lr, interval.seq_len,
                              self._hooks)
        if self.dist.is_main:
            self._write(record)
        self._check_finite()
        interval.restart()
        return record

    def _count_nonfinite(self, skipped: torch.Tensor, sums: dict[str, torch.Tensor]) -> None:
        """Count a step left out for a non-finite loss or gradient norm (``skipped``: 1.0 or 0.0 on the
        device; tensor operations only)."""
        state = self._nonfinite
        if not state:
            zero = torch.zeros((), device=skipped.device)
            state.update(step=zero + self.step, first=zero - 1, streak=zero.clone(), longest=zero.clone())
        state["step"] += 1  # the number of the step just done (self.step is advanced after this)
        state["first"] = torch.where((state["first"] < 0) & (skipped > 0), state["step"], state["first"])
        state["streak"] = (state["streak"] + 1) * skipped
        state["longest"] = torch.maximum(state["longest"], state["streak"])
        sums["skipped_steps"] = sums["skipped_steps"] + skipped if "skipped_steps" in sums else skipped

    def _check_finite(self, weights: bool = False) -> None:
        """Stop with :class:`~pentad.errors.Diverged` when ``train.on_nonfinite`` says so (``stop``: a step was
        left out; ``skip``: more than ``max_skipped_steps`` in a row), or when ``weights`` and the weights
        are not finite (an update can overflow them with finite gradients: an absurd learning rate).
        One host sync; every rank calls it at the same steps and decides alike."""
        cfg = self.cfg
        first = longest = -1
        if self._nonfinite:
            first, longest = (int(v) for v in torch.stack([self._nonfinite["first"], self._nonfinite["longest"]]
                                                          ).tolist())
        stop = cfg.on_nonfinite == "stop" and first >= 0
        too_many = cfg.on_nonfinite == "skip" and longest > cfg.max_skipped_steps
        if not (stop or too_many or (weights and not self._weights_finite())):
            return
        latest = layout.latest_checkpoint(self.run_dir) if self.dist.is_main else None
        kept = (f"the last checkpoint, {latest.name}, is intact and resumes from before it" if latest is not None
                else "no checkpoint was saved")
        advice = "Lower train.lr" + (" or set train.clip_grad_norm" if cfg.clip_grad_norm is None else "") + \
            ", check the data"
        if stop:
            raise Diverged(f"training diverged: the loss or gradient norm of step {first} was not finite (NaN or "
                           f"infinite); the step was left out and the run stopped (train.on_nonfinite=stop) at step "
                           f"{self.step}; nothing non-finite was saved: {kept}. {advice}, or train.on_nonfinite=skip "
                           f"to go on past such steps (at most train.max_skipped_steps in a row)")
        if too_many:
            raise Diverged(f"training diverged: {longest} steps in a row had a non-finite loss or gradient norm, "
                           f"more than train.max_skipped_steps={cfg.max_skipped_steps} (train.on_nonfinite=skip; the "
                           f"first non-finite step was {first}); the run stopped at step {self.step} and nothing "
                           f"non-finite was saved: {kept}. {advice}")
        raise Diverged(f"training diverged: after step {self.step} the model's weights are not finite (NaN or "
                       f"infinite: an update too large for them, train.lr={cfg.lr}); they were not saved "
                       f"(train.on_nonfinite={cfg.on_nonfinite}): {kept}. {advice}")

    def _weights_finite(self) -> bool:
        """Whether every weight of the model (this rank's shards) is finite, on every rank."""
        flags = [torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                 for p in self.strategy.module.parameters() if p.numel()]
        bad = float(not bool(torch.stack([f.to(self.device) for f in flags]).all())) if flags else 0.0
        if self.dist.world_size > 1:
            bad = self.dist.agree_max([bad])[0]
        return not bad

    def _write(self, record: dict[str, Any]) -> None:
        self.log.write(record)
        self.events.write(record)

    @staticmethod
    def _accumulate(sums: dict[str, torch.Tensor], outputs, loss: torch.Tensor, weight: float = 1.0,
                    shares: dict[str, torch.Tensor] | None = None) -> None:
        def add(key: str, value: torch.Tensor) -> None:
            _add(sums, key, value)

        add("loss", loss)
        add("micro_batches", torch.ones(()))
        for name, out in outputs.items():
            if out.loss is not None:
                add(f"{name}_loss", out.loss if shares is None else shares[name])
            for key, value in out.metrics.items():
                add(f"{name}_{key}", value if weight == 1.0 else value * weight)
        if isinstance(outputs, ModelOutput):  # logged as <name>_loss and aux_<metric>, means per micro-batch
            for name, value in outputs.aux_losses.items():
                add(f"{name}_loss", value)
            for name, value in outputs.aux_metrics.items():
                add(f"aux_{name}", value)

    def _record(self, sums: dict[str, torch.Tensor], steps: int, tokens: torch.Tensor, interval_start: float,
                lr: float, seq_len: int = 0, hooks: Sequence[Hook] = ()) -> dict[str, Any]:
        if self.dist.world_size > 1:  # sums over ranks: losses are shares of the global mean (x world), counts add up
            keys = sorted(sums)
            packed = torch.stack([sums[k].to(self.device).float().reshape(()) for k in keys]
                                 + [tokens.to(self.device).float()])
            self.dist.all_reduce(packed)
            world = self.dist.world_size
            averaged = ("loss", "micro_batches", "grad_norm", "skipped_steps")
            sums = {k: packed[i] / world if k in averaged or k.endswith("_loss") or k.startswith("aux_") else packed[i]
                    for i, k in enumerate(keys)}
            tokens = packed[-1]
        values = {k: float(v) for k, v in sums.items()}  # the one host sync per logging interval
        synchronize(self.device)  # all of the interval's work is done (not only what the sums needed)
        elapsed = time.perf_counter() - interval_start
        micro = values.pop("micro_batches", 1.0) or 1.0
        record: dict[str, Any] = {"step": self.step, "loss": values.pop("loss") / micro}
        names = sorted({k[: -len("_loss")] for k in values if k.endswith("_loss")})
        for name in names:
            record[f"{name}_loss"] = values[f"{name}_loss"] / micro
            if values.get(f"{name}_count"):
                record[f"{name}_accuracy"] = values[f"{name}_correct"] / values[f"{name}_count"]
        for key in sorted(k for k in values if k.startswith("aux_")):
            record[key] = values[key] / micro
        if "grad_norm" in values:
            record["grad_norm"] = values["grad_norm"] / steps
        skipped = round(values.pop("skipped_steps", 0.0))
        if skipped:  # steps of the interval left out for a non-finite loss or gradient norm
            record["skipped_steps"] = skipped
        record["lr"] = lr
        for hook in hooks:
            record.update(hook.on_log(self))
        record["tokens_per_s"] = float(tokens) / elapsed if elapsed > 0 else 0.0
        if self.peak_tflops is not None and elapsed > 0:
            # model FLOPs of the interval over what the devices of every rank could have done
            linear, attention = self.flops_per_token
            flops = float(tokens) * (linear + attention * seq_len)
            record["mfu"] = flops / elapsed / (self.peak_tflops * 1e12 * self.dist.world_size)
        record["peak_memory_gib"] = round(peak_memory_gib(self.device), 3)
        return record


def _is_collective_failure(error: BaseException) -> bool:
    """A failure of a collective because a peer went away (gloo/nccl errors, timeouts)."""
    dist_error = getattr(torch.distributed, "DistError", ())
    if dist_error and isinstance(error, dist_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        key in text for key in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "broken pipe"))
