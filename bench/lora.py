"""LoRA against full fine-tuning on this CPU: step time, what trains, optimizer state and checkpoint size.

One model (``gpt2/base`` shrunk to L4 H256 A4, vocabulary 8,000, causal LM on random tokens of
length 128, batch 8), trained in-process with pentad's AdamW in two configurations built from the
same weights:

* ``full``: every weight trains (the reference every ratio is taken against);
* ``lora``: ``train.lora`` with rank 8 on q and v (the default), or ``--targets all``.

Each repetition runs ``--steps`` optimizer steps of each configuration, interleaved (the order
alternates), after one untimed warm-up step each; the table gives the fastest repetition's wall and CPU
seconds per step (CPU: this process's threads together; the fastest, because on a machine shared with
other jobs whole steps of either configuration are slowed several times over at random), the ratio of
``full``'s fastest CPU time to each one's, the trainable parameters, the optimizer state (Adam's two
moments) and the bytes a checkpoint's ``model.safetensors`` takes (LoRA: the adapters alone). Run from
the repository root::

    PYTHONPATH=src .venv/bin/python bench/lora.py              # ~1 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/lora.py --targets all --threads 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.training import checkpoint as ckpt
from pentad.training import lora
from pentad.training.config import LoraConfig, TrainConfig
from pentad.training.optim import build_optimizer

MODEL = ["model.hidden_size=256", "model.vocab_size=8000", "model.max_seq_length=128", "model.encoder.num_layers=4",
         "model.encoder.num_heads=4", "model.encoder.ffn_size=1024"]


def make(targets: list[str] | None, base: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(load_config("gpt2/base", MODEL).model)
    ckpt.load_weights(model, base, "base")
    if targets is not None:
        lora.apply_lora(model, LoraConfig(targets=targets), "base", lora.fingerprint(base))
    model.train()
    return model, build_optimizer(model, TrainConfig(lr=1e-4))


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch) -> None:
    loss = model(batch)["lm"].loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--targets", default="q,v", help="comma-separated train.lora.targets (default q,v)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = ckpt.weights_to_save(build_model(load_config("gpt2/base", MODEL).model))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 8000, (8, 128), generator=g)
    batch = Batch(tokens=tokens, labels={"lm": tokens})
    configs = {"full": make(None, base), "lora": make(args.targets.split(","), base)}
    for model, optimizer in configs.values():
        step(model, optimizer, batch)  # warm-up: oneDNN, the optimizer's state
    times: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name in (list(configs) if repeat % 2 == 0 else list(configs)[::-1]):
            model, optimizer = configs[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step(model, optimizer, batch)
            times[name].append((time.perf_counter() - start) / args.steps)
            cpu[name].append((time.process_time() - start_cpu) / args.steps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); gpt2 L4 H256 A4 V8000, batch 8 x 128; "
          f"lora rank 8 on {args.targets}; best of {args.repeats} x {args.steps} steps")
    print("| config | wall s/step | CPU s/step | CPU vs full | trainable | optimizer state | model.safetensors |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, optimizer) in configs.items():
            ratio = min(cpu["full"]) / min(cpu[name])
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            path = Path(tmp) / f"{name}.safetensors"
            ckpt.save_weights(model, path)
            print(f"| {name} | {min(times[name]):.3f} | {min(cpu[name]):.3f} | "
                  f"{ratio:.2f}x | {trainable:,} | "
                  f"{state_bytes(optimizer) / 1e6:.1f} MB | {path.stat().st_size / 1e6:.2f} MB |")


if __name__ == "__main__":
    main()
