"""One run of training on one or many processes: what ``pentad pretrain`` and ``pentad finetune`` share.

A :class:`Session` connects the processes of a launch (:mod:`pentad.training.distributed`), applies
the thread and seed settings, checks that every rank resolved the same config, takes the run
directory's lock (on the main rank), builds the model (on the meta device on every rank but the
main one when the strategy shards it), loads initial weights, writes the run directory and makes
the :class:`~pentad.training.trainer.Trainer` with the configured strategy. Pre-training and every
fine-tuning task go through it, so both are distributed by the same code.

Only the main rank writes files and prints progress (``pentad.runs.info`` is silent elsewhere).
Work done on the main rank alone goes through :meth:`Session.on_main`, which shares its result, or
its UserError, with every rank, so a mistake stops all ranks with the same message instead of
leaving the others waiting.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from pentad import layout, memory, runs
from pentad.builder import build_model, summarize
from pentad.errors import UserError
from pentad.training import checkpoint as ckpt
from pentad.training import lora
from pentad.training.distributed import Dist, connect, mark_failed, require_launcher
from pentad.training.strategies import STRATEGIES, Strategy
from pentad.training.trainer import Trainer

if TYPE_CHECKING:
    from pentad.config.model import ModelConfigBase
    from pentad.data.tokenizers import Tokenizer
    from pentad.run_config import RunConfigBase
    from pentad.training.config import TrainConfig

T = TypeVar("T")


def default_threads(dist: Dist, environ: dict[str, str] | None = None) -> int | None:
    """Intra-op threads of a CPU rank when ``train.threads`` is unset: the machine's cores shared
    among the ranks on it (1 each for 2 ranks on 2 cores: measured best, docs/distributed.md).
    None: leave torch's default (one process, or GPUs)."""
    environ = os.environ if environ is None else environ
    if not dist.launched or dist.device.type != "cpu":
        return None
    local = int(environ.get("LOCAL_WORLD_SIZE", dist.world_size) or 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local))


@dataclass(frozen=True)
class TrainingMemory:
    """What one rank needs to train a model, at least (activations come on top): ``device`` bytes on
    its device, ``host`` bytes it keeps in CPU memory instead (DeepSpeed's offloading), ``built``: the
    whole model's weights as built on the CPU before a strategy moves or shards them; ``shown``: what
    the first two count."""

    device: int
    host: int
    built: int
    shown: str


def training_memory(model: nn.Module, train: TrainConfig, world: int) -> TrainingMemory:
    """The memory one of ``world`` ranks needs to train ``model`` (built on the meta device, LoRA
    adapters applied) as ``train`` (the TrainConfig) says: the weights, a gradient and AdamW's two
    moments for each trainable weight, divided among the ranks for what the strategy shards (fsdp: all
    of it; deepspeed: by ZeRO stage), in CPU memory for what DeepSpeed offloads."""
    weights, trainable = memory.tensor_bytes(model)
    built = weights  # fp32 as built, before a precision converts it
    if train.precision == "bf16-true":  # bf16 weights, gradients and optimizer state
        weights, trainable = weights // 2, trainable // 2
    moments = "AdamW's two moments"
    parts = {"weights": weights, "gradients": trainable, moments: 2 * trainable}
    sharded: set[str] = set()
    offloaded: set[str] = set()
    if train.strategy == "fsdp":
        sharded = set(parts)
    elif train.strategy == "deepspeed":  # ZeRO 1 shards the optimizer state, 2 the gradients too, 3 everything
        options = train.deepspeed
        sharded = {1: {moments}, 2: {"gradients", moments}, 3: set(parts)}[options.stage]
        if options.offload_optimizer:  # the optimizer steps on the CPU, with the gradients there
            offloaded |= {"gradients", moments}
        if options.offload_parameters and options.stage == 3:
            offloaded.add("weights")
    shards = max(1, world)
    per_rank = {k: v // shards if k in sharded else v for k, v in parts.items()}
    shown = " + ".join(f"{k} {memory.format_bytes(v)}" + (f" / {shards} ranks" if k in sharded and shards > 1 else "")
                       + (" (in CPU memory)" if k in offloaded else "") for k, v in parts.items())
    return TrainingMemory(sum(v for k, v in per_rank.items() if k not in offloaded),
                          sum(v for k, v in per_rank.items() if k in offloaded), built,
                          shown + "; activations come on top")


def check_launch(train: TrainConfig) -> None:
    """The checks of how a run was started that need no process group: the strategy's package is installed,
    and a strategy that cannot run as a plain process was started by a launcher. Made when the run is
    resolved, before anything that follows from the way it runs (the session repeats them)."""
    strategy_cls = STRATEGIES.get(train.strategy)
    strategy_cls.check_installed()
    if strategy_cls.needs_launcher:
        require_launcher(train.strategy)


class Session:
    """Context manager around one training command (see the module docstring)."""

    def __init__(self, cfg: RunConfigBase, command: str):
        self.cfg = cfg
        self.command = command
        self.dist: Dist | None = None
        self.strategy: Strategy | None = None
        self._lock: runs.RunLock | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Session:
        train = self.cfg.train
        if train.curriculum is not None and self.command != "pretrain":
            raise UserError(f"train.curriculum (sequence-length warm-up) is a pre-training option, not one of "
                            f"`pentad {self.command}`: a task's inputs are cut to their length by the task itself, "
                            "and cutting them further would change what its labels describe. Remove train.curriculum")
        strategy_cls = STRATEGIES.get(train.strategy)
        strategy_cls.check_installed()
        self.dist = connect(train.strategy, train.device, train.dist_backend, train.dist_timeout,
                            needs_launcher=strategy_cls.needs_launcher)
        try:
            runs.set_quiet(not self.dist.is_main)
            threads = train.threads or default_threads(self.dist)
            if threads:
                torch.set_num_threads(threads)
            self.dist.check_same("resolved config", self.cfg.model_dump(mode="json"))
            world = self.dist.world_size
            if train.batch_size % world:
                raise self.dist.error(
                    f"train.batch_size={train.batch_size} is not divisible by the {world} processes of this launch: "
                    f"train.batch_size is the micro-batch of all processes together, each rank taking "
                    f"batch_size/{world}; use a multiple of {world}")
            self.on_main(self._take_lock)
            self.strategy = strategy_cls(train, self.dist)
            if self.dist.world_size > 1 or self.dist.launched:
                runs.info(f"{self.dist.world_size} process(es), strategy {train.strategy}, backend "
                          f"{self.dist.backend}, device {self.dist.device} on rank 0"
                          + (f", {threads} thread(s) per rank" if threads else ""))
        except BaseException:
            self._close()
            raise
        return self

    def _take_lock(self) -> None:
        self._lock = runs.RunLock(Path(self.cfg.output), self.command).__enter__()

    def __exit__(self, kind, error, tb) -> None:
        if error is not None and self.dist is not None and self.dist.world_size > 1:
            mark_failed(self.dist, f"{type(error).__name__}: {error}")
        self._close()

    def _close(self) -> None:
        if self.strategy is not None:
            self.strategy.close()
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None
        runs.set_quiet(False)
        if self.dist is not None:
            self.dist.close()

    # ------------------------------------------------------------------ helpers
    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the main rank only; every rank returns its result (or raises its UserError)."""
        outcome: tuple[str, Any] | None = None
        if self.dist.is_main:
            try:
                outcome = ("ok", fn())
            except UserError as e:
                outcome = ("error", str(e))
                if self.dist.world_size == 1:
                    raise
            except BaseException as e:
                if self.dist.world_size > 1:  # the others get a message instead of waiting for the timeout
                    self.dist.broadcast_object(("error", f"rank 0 failed: {type(e).__name__}: {e}"))
                raise
        outcome = self.dist.broadcast_object(outcome)
        if outcome[0] == "error":
            raise self.dist.error(outcome[1])
        return outcome[1]

    def seed(self) -> None:
        torch.manual_seed(self.cfg.train.seed)

    # ------------------------------------------------------------------ model
    def build(self, model_cfg: ModelConfigBase, provided: Iterable[str] | None, init: Path | None = None,
              **load_options: Any) -> nn.Module:
        """Build the model and load ``init`` weights (call :meth:`seed` first: every rank then builds
        the same weights).

        With a sharding strategy only the main rank materialises the whole model (on the CPU);
        the others build it on the meta device and receive their shards from the main rank when
        the strategy is set up. ``load_options`` go to :func:`~pentad.training.checkpoint.load_weights`.
        With ``train.lora`` the model is then adapted (:func:`pentad.training.lora.apply_lora`): its
        ``init`` weights are the frozen base, ``new_heads`` the task's heads, which train by default.
        """
        compression = getattr(model_cfg, "compression", None)
        if compression is not None and compression.quantize is not None:
            raise UserError(f"model.compression.quantize is {compression.quantize}: a quantized model is for "
                            "inference only (pentad infer, generate) and cannot train; fine-tune the run it was "
                            "quantized from, then quantize again")
        adapters = self.cfg.train.lora
        if adapters is not None:
            lora.check_usable(self.cfg.train, init)
        self.check_memory(model_cfg, provided, tuple(load_options.get("new_heads", ())))
        on_meta = self.strategy.sharded and not self.dist.is_main
        model = build_model(model_cfg, provided=provided, device="meta" if on_meta else None)
        runs.info(summarize(model))
        base: dict[str, Any] = {}
        if init is not None:
            def load() -> tuple[list[str], dict[str, Any]]:
                path = ckpt.find_weights(Path(init))
                tensors = ckpt.read_weights(path)
                try:
                    notes = ckpt.load_weights(model, tensors, str(init), adapt=True, **load_options)
                except UserError as mismatch:
                    raise _compressed_init_error(Path(init), model_cfg) or \
                        _other_model_error(Path(init), model_cfg, mismatch) or mismatch from None
                if adapters is None:
                    return notes, {}
                # a LoRA run records its base: the weights it starts from, a fingerprint of them, and
                # which heads it has that they lack (saved with the adapters, trained or not)
                heads = {k.split(".")[1] for k in tensors if k.startswith("targets.")}
                return notes, {"base": str(path.resolve()), "base_fingerprint": lora.fingerprint(tensors),
                               "fresh_heads": tuple(h for h in load_options.get("new_heads", ()) if h not in heads)}
            notes, base = self.on_main(load) if self.strategy.sharded else load()
            for note in notes:
                runs.info(note)
        if adapters is not None:
            lora.apply_lora(model, adapters, task_heads=tuple(load_options.get("new_heads", ())), **base)
            runs.info(lora.describe(model))
        if self.dist.world_size > 1:  # dropout: each rank its own random stream
            torch.manual_seed(self.cfg.train.seed + 1_000_003 * self.dist.rank)
        return model

    def check_memory(self, model_cfg: ModelConfigBase, provided: Iterable[str] | None,
                     task_heads: tuple[str, ...] = ()) -> None:
        """Refuse (UserError, on every rank) a model that cannot fit before any of it is allocated:
        built on the meta device (with the LoRA adapters, whose rank is checked), its training memory
        (:func:`training_memory`) is compared with what the main rank's device has available, and the
        whole model's weights with the machine's memory (the main rank materialises them there).
        ``PENTAD_SKIP_MEMORY_CHECK=1`` skips the comparison (:mod:`pentad.memory`)."""
        model = build_model(model_cfg, provided=provided, device="meta")
        if self.cfg.train.lora is not None:
            lora.apply_lora(model, self.cfg.train.lora, base="", base_fingerprint="", task_heads=task_heads)
        need = training_memory(model, self.cfg.train, self.dist.world_size)
        device = self.dist.device
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size) or 1)
        hint = ("Make the model smaller (model.hidden_size, num_layers, ffn_size, vocab_size, the number of "
                "experts), train LoRA adapters (train.lora), or shard it over more ranks (train.strategy=fsdp)")
        ranks = f" on {local} ranks of this machine" if local > 1 else ""
        times = f"; x {local} ranks" if local > 1 else ""

        def check() -> None:
            # the ranks on one machine share its memory; the main rank first builds the whole model there
            if device.type == "cpu":
                memory.require(max(need.built, (need.device + need.host) * local), "training this model" + ranks,
                               need.shown + times, "cpu", hint)
            else:
                memory.require(max(need.built, need.host * local), "building this model on the CPU" + ranks,
                               f"its weights {memory.format_bytes(need.built)}, or what each rank keeps in CPU "
                               f"memory{times}: {need.shown}", "cpu", hint)
                memory.require(need.device, "training this model on each rank's device", need.shown, device, hint)
        self.on_main(check)

    def prepare_run_dir(self, tokenizer: Tokenizer | None, **options: Any) -> dict[str, tuple[Any, Any]]:
        """``pentad.runs.prepare_run_dir`` on the main rank; the accepted changes on every rank."""
        return self.on_main(lambda: runs.prepare_run_dir(Path(self.cfg.output), self.cfg, tokenizer, **options))

    def trainer(self, model: nn.Module, total_steps: int, description: str,
                schedule_steps: float | None = None) -> Trainer:
        """The Trainer of this run (its optional behaviours are hooks given to ``Trainer.train``);
        ``schedule_steps``: see :class:`Trainer`."""
        return Trainer(model, self.cfg.train, Path(self.cfg.output), total_steps, self.strategy,
                       description=description, schedule_steps=schedule_steps)


# model keys that change no weight's shape: they may differ from the init run's without a mismatch
_FREE_MODEL_KEYS = ("dropout", "attention_dropout", "drop_path", "targets", "compression", "init_std")


def _other_model_error(init: Path, model_cfg: ModelConfigBase, mismatch: UserError) -> UserError | None:
    """Why the weights of the run ``init`` do not fit: the keys of this config's model that differ from the
    run's (e.g. ``--config t5/small init=RUN`` for a run made with other sizes), or None when ``init`` is
    not a run directory or the models agree (the tensor list then says what is wrong)."""
    try:
        init_cfg, _ = runs.load_run(init)
    except UserError:
        return None
    ours = runs.flatten(model_cfg.model_dump(mode="json"), "model")
    theirs = runs.flatten(init_cfg.model.model_dump(mode="json"), "model")
    differ = [key for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)
              and not any(part in _FREE_MODEL_KEYS for part in key.split("."))]
    if not differ:
        return None
    shown = "; ".join(f"{key}: {ours.get(key)!r} here, {theirs.get(key)!r} in the run" for key in differ[:12])
    more = f" (and {len(differ) - 12} more)" if len(differ) > 12 else ""
    first = str(mismatch).split(";")[0].split("\n")[0][:200]
    return UserError(f"init={init} is a run with another model than this config's, so its weights do not fit "
                     f"({first} ...): {shown}{more}. Leave the model out (no --config, or a config without a "
                     f"model section): a run initialised from a run directory takes that run's model; or give "
                     f"the run's values (its model is in {init / layout.CONFIG}).")


def _compressed_init_error(init: Path, model_cfg: ModelConfigBase) -> UserError | None:
    """Why the weights of ``init`` do not fit when it is a compressed run (``pentad compress``) and the model
    being built is not compressed the same way, or None when that is not the reason."""
    try:
        init_cfg, _ = runs.load_run(init)
    except UserError:
        return None
    theirs = init_cfg.model.compression
    if theirs is None or theirs == getattr(model_cfg, "compression", None):
        return None
    done = [f"quantized to {theirs.quantize}"] if theirs.quantize else []
    done += [f"attention heads pruned in {len(theirs.heads)} block(s)"] if theirs.heads else []
    done += [f"feed-forward units pruned in {len(theirs.ffn)} block(s)"] if theirs.ffn else []
    saved = init / layout.CONFIG
    if theirs.quantize:
        advice = ("A quantized model is for inference only and cannot train: initialise from the run it was "
                  "quantized from (compress.json in it names the source, where there is one)")
    else:
        advice = (f"Fine-tune it with its own model, which records the pruned sizes: leave the model out of the "
                  f"config (init={init} then takes the run's), or --config {saved}")
    return UserError(f"init={init} is a compressed run ({', '.join(done) or 'model.compression is set'}; "
                     f"model.compression in {saved}): its weights fit only a model compressed the same way, and "
                     f"this config's model is not. {advice}.")
