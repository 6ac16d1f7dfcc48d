"""One Trainer with one generic step, for pre-training and fine-tuning alike.

Objective-specific work lives in objectives (data -> Batch) and targets (hidden -> loss); the
trainer only sums target losses, accumulates gradients, clips, steps, logs and checkpoints.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pentad.components.base import Batch
from pentad.errors import UserError
from pentad.model import total_loss
from pentad.training import checkpoint as ckpt
from pentad.training.config import TrainConfig
from pentad.training.optim import build_optimizer, build_schedule

BatchStream = Callable[[int], Iterator[Batch]]  # start micro-batch index -> batches from there


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UserError("train.device=cuda but no CUDA device is available; use train.device=auto")
        return torch.device("cuda")
    return torch.device("cpu")


def batch_tokens(batch: Batch) -> torch.Tensor:
    """Number of real (non-padding) tokens in a batch, as a tensor (no host sync)."""
    ref = batch.tokens if batch.tokens is not None else batch.decoder_tokens
    if ref is None:
        return torch.tensor(batch.batch_size)
    if batch.padding_mask is None:
        return torch.tensor(ref.numel(), device=ref.device)
    return (~batch.padding_mask).sum()


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

    def truncate_after(self, step: int) -> None:
        """On resume, forget intervals logged after the checkpoint (they will be redone)."""
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        ckpt.atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))


class Trainer:
    """Trains ``model`` for ``total_steps`` optimizer steps on batches from a ``BatchStream``.

    evaluate(step) -> dict of metrics is called every ``cfg.eval_every`` steps (or at the steps in
    ``eval_steps``); its result is logged, and ``on_eval(step, metrics)`` may save a best model.
    """

    def __init__(self, model: nn.Module, cfg: TrainConfig, run_dir: Path, total_steps: int,
                 device: torch.device, weights_metadata: dict[str, str] | None = None,
                 description: str = "train"):
        self.model = model.to(device)
        self.cfg = cfg
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.device = device
        self.description = description
        self.metadata = weights_metadata or {}
        self.optimizer = build_optimizer(self.model, cfg)
        self.schedule = build_schedule(self.optimizer, cfg, total_steps)
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.step = 0

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "micro_batches": self.step * self.cfg.grad_accum,
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "rng_cpu": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def save(self) -> Path:
        return ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.state(), self.cfg.keep_checkpoints,
                                    self.metadata)

    def resume(self) -> bool:
        """Continue from the latest checkpoint of the run directory, if there is one."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            return False
        ckpt.load_weights(self.model, ckpt.read_weights(latest / ckpt.WEIGHTS), str(latest))
        state = ckpt.load_state(latest)
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["rng_cpu"])
        if "rng_cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng_cuda"], self.device)
        self.step = int(state["step"])
        self.log.truncate_after(self.step)
        print(f"resuming from {latest} (step {self.step})", file=sys.stderr)
        return True

    # ------------------------------------------------------------------ loop
    def autocast(self):
        if self.cfg.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def train(self, stream: BatchStream, evaluate: Callable[[int], dict[str, float]] | None = None,
              eval_steps: set[int] | None = None,
              on_eval: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
        from tqdm import tqdm

        cfg = self.cfg
        batches = stream(self.step * cfg.grad_accum)
        self.model.train()
        sums: dict[str, torch.Tensor] = {}
        tokens = torch.zeros((), dtype=torch.long, device=self.device)
        interval_start, interval_steps = time.perf_counter(), 0
        last: dict[str, Any] = {}
        bar = tqdm(total=self.total_steps, initial=self.step, desc=self.description, unit="step",
                   disable=not cfg.progress, dynamic_ncols=True, file=sys.stderr)
        try:
            end = min(self.total_steps, cfg.stop_at or self.total_steps)
            while self.step < end:
                for _ in range(cfg.grad_accum):
                    try:
                        batch = next(batches).to(self.device, non_blocking=True)
                    except StopIteration:
                        raise UserError("the data ran out before the last step") from None
                    with self.autocast():
                        outputs = self.model(batch)
                        loss = total_loss(outputs)
                    (loss / cfg.grad_accum).backward()
                    with torch.no_grad():
                        self._accumulate(sums, outputs, loss)
                        tokens += batch_tokens(batch)
                if cfg.clip_grad_norm is not None:
                    sums["grad_norm"] = sums.get("grad_norm", 0) + torch.nn.utils.clip_grad_norm_(
                        self.model.parameters(), cfg.clip_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                lr = self.schedule.get_last_lr()[0]
                self.schedule.step()
                self.step += 1
                interval_steps += 1
                bar.update(1)
                done = self.step == end
                if self.step % cfg.log_every == 0 or done:
                    elapsed = time.perf_counter() - interval_start
                    last = self._record(sums, interval_steps, tokens, elapsed, lr)
                    self.log.write(last)
                    bar.set_postfix(loss=f"{last['loss']:.4f}")
                    sums, interval_steps = {}, 0
                    tokens = torch.zeros((), dtype=torch.long, device=self.device)
                    interval_start = time.perf_counter()
                if evaluate is not None and (eval_steps is not None and self.step in eval_steps):
                    metrics = evaluate(self.step)
                    self.model.train()
                    self.log.write({"step": self.step, **{f"dev_{k}": v for k, v in metrics.items()}})
                    bar.write(f"step {self.step}: " + ", ".join(f"dev {k} {v:.4f}" for k, v in metrics.items()))
                    if on_eval is not None:
                        on_eval(self.step, metrics)
                if (cfg.save_every and self.step % cfg.save_every == 0) or done:
                    self.save()
        finally:
            bar.close()
        return last

    @staticmethod
    def _accumulate(sums: dict[str, torch.Tensor], outputs, loss: torch.Tensor) -> None:
        def add(key: str, value: torch.Tensor) -> None:
            value = value.detach().float()
            sums[key] = sums[key] + value if key in sums else value

        add("loss", loss)
        add("micro_batches", torch.ones(()))
        for name, out in outputs.items():
            if out.loss is not None:
                add(f"{name}_loss", out.loss)
            for key, value in out.metrics.items():
                add(f"{name}_{key}", value)

    def _record(self, sums: dict[str, torch.Tensor], steps: int, tokens: torch.Tensor, elapsed: float,
                lr: float) -> dict[str, Any]:
        values = {k: float(v) for k, v in sums.items()}  # the one host sync per logging interval
        micro = values.pop("micro_batches", 1.0) or 1.0
        record: dict[str, Any] = {"step": self.step, "loss": values.pop("loss") / micro}
        names = sorted({k[: -len("_loss")] for k in values if k.endswith("_loss")})
        for name in names:
            record[f"{name}_loss"] = values[f"{name}_loss"] / micro
            if values.get(f"{name}_count"):
                record[f"{name}_accuracy"] = values[f"{name}_correct"] / values[f"{name}_count"]
        if "grad_norm" in values:
            record["grad_norm"] = values["grad_norm"] / steps
        record["lr"] = lr
        record["tokens_per_s"] = float(tokens) / elapsed if elapsed > 0 else 0.0
        return record


def plot_losses(metrics_path: Path, out: Path) -> Path | None:
    """Draw loss (total and per target) against step from ``metrics.jsonl`` into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in MetricsLog(metrics_path).read() if "loss" in r]
    if not records:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = ["loss"] + sorted({k for r in records for k in r if k.endswith("_loss")})
    for key in keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=key, linewidth=1.5 if key == "loss" else 1)
    dev = [(r["step"], r[k]) for r in MetricsLog(metrics_path).read() for k in r if k == "dev_accuracy"]
    if dev:
        twin = ax.twinx()
        twin.plot([d[0] for d in dev], [d[1] for d in dev], "k--o", label="dev accuracy", markersize=3)
        twin.set_ylabel("dev accuracy")
        twin.legend(loc="upper center")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
