"""Structured pruning of a fine-tuned run (``pentad compress RUN --output OUT --prune heads=0.3,ffn=0.3``).

Importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"): a gate of ones multiplies
each attention head's output (before the output projection) and each feed-forward unit (before the down
projection; both found through the blocks' ``roles()``); the importance of a head or unit is the sum
over labelled batches of ``|dL / d gate|``, the first-order change of the task loss if it were removed.
Head scores are normalised per layer (L2), as in the paper, unit scores too; the least important
``fraction`` of all heads (of all units) is removed, keeping at least one per block. Removal is physical
(:mod:`pentad.layers.pruning`): smaller ``qkv``, ``out``, ``up``/``gate`` and ``down`` matrices, so the
pruned model is smaller and faster. The kept sizes go to ``model.compression.heads`` / ``.ffn`` of OUT's
config, which rebuilds the shapes when it is read.

Unstructured magnitude sparsity (``sparsity=0.5``) zeroes the smallest weights of every linear layer of
the stacks, each matrix on its own; it changes no shape (and so no speed without sparse kernels).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pentad.components.base import Batch
from pentad.compression.store import check_output, load_run_model, weights_bytes, with_compression, write_run
from pentad.errors import UserError
from pentad.layers.attention import Attention
from pentad.layers.feed_forward import FeedForward
from pentad.layers.pruning import (
    ffn_size,
    keep_heads,
    keep_neurons,
    magnitude_sparsify,
    prunable_heads,
    reading_projection,
)
from pentad.layers.transformer import TransformerStack
from pentad.model import total_loss
from pentad.registry import TASKS
from pentad.runs import load_run
from pentad.tasks.runner import read_task_state

PRUNE_KEYS = ("heads", "ffn", "sparsity")


def parse_prune(text: str) -> dict[str, float]:
    """``heads=0.3,ffn=0.3,sparsity=0.5`` -> {name: fraction}; each fraction in [0, 1)."""
    found: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in PRUNE_KEYS:
            raise UserError(f"--prune {text!r}: expected KEY=FRACTION items separated by commas, KEY one of "
                            f"{', '.join(PRUNE_KEYS)} (e.g. --prune heads=0.3,ffn=0.3); found {item!r}")
        try:
            fraction = float(value)
        except ValueError:
            raise UserError(f"--prune {text!r}: {key}={value!r} is not a number (a fraction such as 0.3)") from None
        if not 0.0 <= fraction < 1.0:
            raise UserError(f"--prune {text!r}: {key}={fraction:g} must be at least 0 and below 1 (the fraction "
                            "removed)")
        found[key] = fraction
    if not found:
        raise UserError(f"--prune {text!r}: nothing to prune; e.g. --prune heads=0.3,ffn=0.3")
    return found


def prunable_blocks(model: nn.Module) -> tuple[dict[str, Attention], dict[str, FeedForward], list[str]]:
    """(self-attention blocks whose heads can be pruned, dense/gated feed-forward blocks, reasons others
    cannot) of ``model``'s transformer stacks, by module name."""
    heads: dict[str, Attention] = {}
    ffns: dict[str, FeedForward] = {}
    refused: list[str] = []
    for stack_name, stack in model.named_modules():
        if not isinstance(stack, TransformerStack):
            continue
        per_head_bias = stack.position_kind in ("relative", "alibi")
        for i, layer in enumerate(stack.layers):
            prefix = f"{stack_name}.layers.{i}"
            why = prunable_heads(layer.attention) if isinstance(layer.attention, Attention) else "not multi-head"
            if why is None and per_head_bias:
                why = f"the stack's {stack.position_kind} position bias has one row per head"
            if why is None and getattr(stack, "attention_reuse", None) is not None:
                why = "its stack reuses attention probabilities across layers"
            if why is None:
                heads[f"{prefix}.attention"] = layer.attention
            else:
                refused.append(f"{prefix}.attention: {why}")
            if type(layer.ffn) is FeedForward:
                ffns[f"{prefix}.ffn"] = layer.ffn
            else:
                refused.append(f"{prefix}.ffn: a {type(layer.ffn).__name__}, not a dense or gated feed-forward")
    return heads, ffns, refused


def importance(model: nn.Module, batches: Iterable[Batch], heads: dict[str, Attention],
               ffns: dict[str, FeedForward]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per block, ``sum over batches |dL/d gate|`` of each head / feed-forward unit (see the module
    docstring); ``batches`` carry labels. The model's weights are left as they were."""
    gates: dict[str, Tensor] = {}
    hooks = []

    def gate_hook(gate: Tensor, group: int):
        def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0]
            shaped = x.unflatten(-1, (gate.numel(), group)) * gate[:, None]
            return (shaped.flatten(-2), *args[1:])
        return hook

    for name, attention in heads.items():
        gates[f"h:{name}"] = torch.ones(attention.num_heads, requires_grad=True)
        hooks.append(reading_projection(attention).register_forward_pre_hook(
            gate_hook(gates[f"h:{name}"], attention.head_size)))
    for name, ffn in ffns.items():
        gates[f"f:{name}"] = torch.ones(ffn_size(ffn), requires_grad=True)
        hooks.append(reading_projection(ffn).register_forward_pre_hook(gate_hook(gates[f"f:{name}"], 1)))
    scores = {k: torch.zeros_like(g) for k, g in gates.items()}
    was_training = model.training
    flags = {p: p.requires_grad for p in model.parameters()}
    model.eval()  # no dropout: the scores of the model as it predicts
    model.requires_grad_(False)
    seen = 0
    try:
        with torch.enable_grad():
            for batch in batches:
                loss = total_loss(model(batch))
                grads = torch.autograd.grad(loss, list(gates.values()), allow_unused=True)
                for key, grad in zip(gates, grads):
                    if grad is not None:
                        scores[key] += grad.abs()
                seen += 1
    finally:
        for hook in hooks:
            hook.remove()
        for p, flag in flags.items():
            p.requires_grad_(flag)
        model.train(was_training)
    if seen == 0:
        raise UserError("no labelled batch to score the importance of heads and units on (the data file is empty)")
    return ({k[2:]: v for k, v in scores.items() if k.startswith("h:")},
            {k[2:]: v for k, v in scores.items() if k.startswith("f:")})


def choose(scores: dict[str, Tensor], fraction: float) -> dict[str, list[int]]:
    """Per block, the indices kept when the ``fraction`` of all entries with the lowest per-block
    L2-normalised scores goes, at least one kept per block (kept in their original order)."""
    normalised = {k: v / v.norm().clamp_min(1e-20) for k, v in scores.items()}
    entries = sorted((float(s), name, i) for name, v in normalised.items() for i, s in enumerate(v.tolist()))
    total = len(entries)
    drop = int(math.floor(fraction * total + 1e-9))
    left = {name: v.numel() for name, v in scores.items()}
    removed: dict[str, set[int]] = {name: set() for name in scores}
    for _, name, i in entries:
        if drop == 0:
            break
        if left[name] > 1:
            removed[name].add(i)
            left[name] -= 1
            drop -= 1
    return {name: [i for i in range(v.numel()) if i not in removed[name]] for name, v in scores.items()}


def task_batches(run: Path, cfg: Any, tokenizer: Any, data: Path | None, batch_size: int = 32,
                 limit: int | None = 512) -> tuple[Iterator[Batch], int, Path]:
    """(labelled batches of ``data`` or the run's dev file, else its training file, the number of
    examples, the file) read by the run's task: at most ``limit`` examples."""
    if cfg.task is None:
        raise UserError(f"{run} is not a fine-tuned run (its config has no task): pruning scores heads and units "
                        "with the task's loss, so it needs a run of pentad finetune")
    path = data or getattr(cfg.data, "dev", None) or getattr(cfg.data, "train", None)
    if path is None:
        raise UserError(f"{run}'s config names no data.dev or data.train file to score importance on: give --data "
                        "FILE (labelled, in the task's format)")
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist (the labelled file importance is scored on; the run's data.dev, "
                        "data.train or --data FILE)")
    seq_length = cfg.data.objective.seq_length if cfg.data.objective is not None else cfg.model.max_seq_length
    task = TASKS.get(cfg.task.type)(cfg.task, tokenizer, min(seq_length, cfg.model.max_seq_length),
                                    read_task_state(run))
    task.bind(cfg)
    instances = task.read(path, with_labels=True)
    n = len(instances) if limit is None else min(limit, len(instances))
    rng = np.random.default_rng(0)

    def batches() -> Iterator[Batch]:
        for begin in range(0, n, batch_size):
            yield task.collate(instances, np.arange(begin, min(n, begin + batch_size)), rng)

    return batches(), n, path


@dataclass
class Pruned:
    out: Path
    heads: tuple[int, int] = (0, 0)  # (kept, before)
    units: tuple[int, int] = (0, 0)
    zeroed: int = 0
    examples: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        parts = []
        if self.heads[1]:
            parts.append(f"attention heads {self.heads[1]} -> {self.heads[0]}")
        if self.units[1]:
            parts.append(f"feed-forward units {self.units[1]:,} -> {self.units[0]:,}")
        if self.zeroed:
            parts.append(f"{self.zeroed:,} weights zeroed by magnitude")
        scored = f" (importance on {self.examples:,} examples)" if self.examples else ""
        return (f"pruned {', '.join(parts)}{scored}: {self.bytes_before / 1e6:,.2f} MB -> "
                f"{self.bytes_after / 1e6:,.2f} MB, wrote {self.out}")


def prune_model(model: nn.Module, fractions: dict[str, float], batches: Iterable[Batch] | None = None
                ) -> tuple[dict[str, int], dict[str, int], Pruned]:
    """Prune ``model`` in place as ``fractions`` say (:func:`parse_prune`); ``batches`` (labelled) score
    importance when heads or units go. Returns (heads kept per attention block, width per feed-forward
    block, figures) of the blocks that were cut."""
    result = Pruned(Path())
    heads, ffns, refused = prunable_blocks(model)
    want_heads, want_ffn = fractions.get("heads", 0.0), fractions.get("ffn", 0.0)
    if want_heads and not heads:
        raise UserError("--prune heads: this model has no attention block whose heads can be pruned ("
                        + "; ".join(refused[:4]) + ")")
    if want_ffn and not ffns:
        raise UserError("--prune ffn: this model has no dense or gated feed-forward block (" + "; ".join(refused[:4])
                        + ")")
    kept_heads: dict[str, int] = {}
    kept_ffn: dict[str, int] = {}
    if want_heads or want_ffn:
        if batches is None:
            raise ValueError("structured pruning needs labelled batches to score importance")
        head_scores, unit_scores = importance(model, batches, heads if want_heads else {},
                                              ffns if want_ffn else {})
        if want_heads:
            before = sum(a.num_heads for a in heads.values())
            for name, keep in choose(head_scores, want_heads).items():
                if len(keep) < heads[name].num_heads:
                    keep_heads(heads[name], keep)
                kept_heads[name] = heads[name].num_heads
            result.heads = (sum(a.num_heads for a in heads.values()), before)
        if want_ffn:
            before = sum(ffn_size(f) for f in ffns.values())
            for name, keep in choose(unit_scores, want_ffn).items():
                if len(keep) < ffn_size(ffns[name]):
                    keep_neurons(ffns[name], keep)
                kept_ffn[name] = ffn_size(ffns[name])
            result.units = (sum(ffn_size(f) for f in ffns.values()), before)
    if fractions.get("sparsity"):
        result.zeroed = magnitude_sparsify(model, fractions["sparsity"])
    return kept_heads, kept_ffn, result


def prune_run(run: Path, out: Path, fractions: dict[str, float], data: Path | None = None,
              overwrite: bool = False, limit: int | None = 512) -> Pruned:
    """Write ``run`` pruned as ``fractions`` say to ``out`` (see the module docstring); importance is scored
    on ``data`` (default the run's dev file) with the run's task, on at most ``limit`` examples."""
    run, out = Path(run), Path(out)
    check_output(run, out, overwrite)
    cfg, tokenizer = load_run(run)
    if cfg.model.compression is not None and cfg.model.compression.quantize is not None:
        raise UserError(f"{run} is quantized ({cfg.model.compression.quantize}): prune before quantizing (pentad "
                        "compress does the steps in that order)")
    model, cfg, tokenizer = load_run_model(run)
    before = weights_bytes(model)
    batches, examples = None, 0
    if fractions.get("heads") or fractions.get("ffn"):
        batches, examples, _ = task_batches(run, cfg, tokenizer, data, limit=limit)
    kept_heads, kept_ffn, result = prune_model(model, fractions, batches)
    previous = cfg.model.compression
    heads = {**(previous.heads if previous else {}), **kept_heads}
    ffn = {**(previous.ffn if previous else {}), **kept_ffn}
    sparsity = max(fractions.get("sparsity", 0.0), previous.sparsity if previous else 0.0)
    new_cfg = with_compression(cfg, heads=heads, ffn=ffn, sparsity=sparsity)
    write_run(run, out, new_cfg, model, {"step": "prune", "source": str(run.resolve()), "fractions": fractions,
                                         "examples": examples})
    return replace(result, out=out, examples=examples, bytes_before=before, bytes_after=weights_bytes(model))
