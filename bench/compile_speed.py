"""``train.compile`` against eager execution: the same pentad model trained with each mode, one process.

For each workload the model is built three times from the same seed (``off``: eager; ``blocks``:
each transformer layer compiled; ``model``: the whole forward compiled, both with
``pentad.training.compile_model``, as ``train.compile`` does) and trained for ``--steps`` steps
(forward, backward, AdamW step; dropout off so that the three compute the same losses); after
``--warmup`` steps each, the timed steps of the three take turns (each mode going first in turn), so
a load that comes and goes hits all alike. Reported: the seconds of the first step (which compiles),
the median step time, the speed-up over eager, and the largest difference of the losses from eager's
(a check that the three train the same model). Workloads (reduced sizes, so a CPU run takes minutes):

* ``gpt2``: ``gpt2/base`` at width 256, 4 layers, 4 heads, causal LM, batch 8 x 256;
* ``bert``: ``bert/base`` at width 256, 4 layers, 4 heads, masked LM (15 %) + next-sentence, batch 8 x 128;
* ``vit``: ``vit/tiny-16`` (12 layers, width 192) at 224x224, 10 classes, batch 8.

Run from the repository root (a GPU is used when there is one; ``--device cpu`` forces the CPU)::

    PYTHONPATH=src .venv/bin/python bench/compile_speed.py --models gpt2,vit --threads 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.model import total_loss
from pentad.training.compiled import compile_model
from pentad.training.config import TrainConfig
from pentad.training.optim import build_optimizer

VOCAB = 8000
TEXT = {"model.hidden_size": 256, "model.encoder.num_layers": 4, "model.encoder.num_heads": 4,
        "model.encoder.ffn_size": 1024, "model.vocab_size": VOCAB}
WORKLOADS = {"gpt2": ("gpt2/base", TEXT, 256), "bert": ("bert/base", TEXT, 128), "vit": ("vit/tiny-16", {}, 0)}


def build(name: str, device: torch.device):
    recipe, overrides, _ = WORKLOADS[name]
    cfg = load_config(recipe, [f"{k}={v}" for k, v in overrides.items()])
    if name == "vit":
        cfg.model.targets[0].num_labels = 10
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device)
    for module in model.modules():  # no dropout: the three modes then compute the same losses
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(getattr(module, "dropout", None), float):
            module.dropout = 0.0
    return model


def batch(name: str, size: int, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(1)
    if name == "vit":
        return Batch(pixels=torch.randn(size, 3, 224, 224, generator=g),
                     labels={"cls": torch.randint(0, 10, (size,), generator=g)}).to(device)
    seq = WORKLOADS[name][2]
    tokens = torch.randint(5, VOCAB, (size, seq), generator=g)
    if name == "gpt2":
        return Batch(tokens=tokens, labels={"lm": tokens}).to(device)
    mlm = tokens.masked_fill(torch.rand(size, seq, generator=g) > 0.15, -100)
    segments = (torch.arange(seq) >= seq // 2).long().expand(size, seq)
    return Batch(tokens=tokens, segments=segments, labels={"mlm": mlm, "sp": torch.arange(size) % 2}).to(device)


def prepare(name: str, mode: str, args, device: torch.device) -> dict:
    """The model of ``mode`` with its optimizer and batch, after the warm-up steps (the first compiles)."""
    model = build(name, device)
    compile_model(model, mode)
    model.train()
    state = {"model": model, "optimizer": build_optimizer(model, TrainConfig(lr=1e-4)),
             "batch": batch(name, args.batch_size, device), "times": [], "losses": []}
    start = time.perf_counter()
    step(state)
    state["first"] = time.perf_counter() - start
    for _ in range(args.warmup - 1):
        step(state)
    return state


def step(state: dict) -> float:
    """One training step; returns its seconds (the loss read back: the step has finished)."""
    start = time.perf_counter()
    loss = total_loss(state["model"](state["batch"]))
    loss.backward()
    state["optimizer"].step()
    state["optimizer"].zero_grad(set_to_none=True)
    state["losses"].append(float(loss.detach()))
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,bert,vit")
    p.add_argument("--modes", default="off,blocks,model")
    p.add_argument("--steps", type=int, default=8, help="timed steps of each mode after the warm-up")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing (the first compiles)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or 'cpu'}, " \
        f"{args.threads} threads"
    print(f"torch {torch.__version__}, {where}; batch {args.batch_size}, fp32, {args.steps} timed steps after "
          f"{args.warmup}")
    print("| model | compile | first step s | step ms (median) | speed-up | largest loss difference |")
    print("|---|---|---:|---:|---:|---:|")
    modes = args.modes.split(",")
    for name in args.models.split(","):
        torch._dynamo.reset()  # no compiled code of the previous workload
        states = {mode: prepare(name, mode, args, device) for mode in modes}
        for rep in range(args.steps):  # the modes take turns, each going first in turn: load hits all alike
            for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
                states[mode]["times"].append(step(states[mode]))
        eager = states[modes[0]]
        median = {mode: statistics.median(states[mode]["times"]) for mode in modes}
        for mode in modes:
            r = states[mode]
            # the same weights, batch and steps: the losses of every step agree up to float rounding
            diff = max(abs(a - b) for a, b in zip(r["losses"], eager["losses"]))
            print(f"| {name} | {mode} | {r['first']:.1f} | {1000 * median[mode]:.0f} | "
                  f"{median[modes[0]] / median[mode]:.2f}x | {diff:.1e} |", flush=True)
        del states


if __name__ == "__main__":
    main()
