"""Mixture of experts against the dense model of equal *active* parameters, on CPU.

Three causal decoders of the same body (``--layers`` x ``--hidden``, ``--heads`` heads, vocabulary
``--vocab``), differing only in their feed-forwards:

* ``dense``: one gated (SwiGLU) feed-forward of width ``top_k * expert_ffn`` per layer;
* ``moe``: ``--experts`` gated experts of width ``expert_ffn``, top-``k`` routing, dropless;
* ``moe-cap1.25``: the same with capacity factor 1.25 (assignments over capacity dropped).

A token passes through the same number of feed-forward parameters in all three (the router's
``experts x hidden`` apart), so the MoE models hold ``experts / k`` times the feed-forward parameters
at (ideally) the dense model's cost per token. Measured, fp32, ``--threads`` threads:

* ``train``: forward + backward + AdamW step of a batch (load-balancing loss on);
* ``infer``: eval mode, ``torch.inference_mode``, forward with labels.

Repetitions alternate between the models and rotate which goes first; the median is reported.
tokens/s = batch x sequence / seconds; the ratio is MoE / dense. Peak memory is measured apart, in a
fresh process per model and mode (its peak resident set after three steps, less its resident set after
one step of a tiny model of the same kind: the model, its gradients and optimizer state, the activations),
since a process's peak cannot be reset.

Run from the repository root (about a minute on one core)::

    PYTHONPATH=src .venv/bin/python bench/moe.py
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

MODELS = ("dense", "moe", "moe-cap1.25")


def model_dict(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "dense":
        ffn: dict[str, Any] = {"ffn": "gated", "ffn_size": args.top_k * args.expert_ffn}
    else:
        ffn = {"ffn": "moe", "ffn_size": args.expert_ffn,
               "moe": {"num_experts": args.experts, "top_k": args.top_k, "expert": "gated",
                       "capacity_factor": 1.25 if name == "moe-cap1.25" else None}}
    return {"hidden_size": args.hidden, "vocab_size": args.vocab, "max_seq_length": args.seq,
            "tie_word_embeddings": False, "embedding": {"parts": ["word"], "norm": False, "dropout": 0.0},
            "encoder": {"type": "transformer", "num_layers": args.layers, "num_heads": args.heads,
                        "activation": "silu", "norm": "rmsnorm", "norm_position": "pre", "mask": "causal",
                        "dropout": 0.0, "bias": False, "positions": "rotary", **ffn},
            "targets": [{"type": "lm"}]}


def build(name: str, args: argparse.Namespace):
    from pentad.builder import build_model
    from pentad.components.model_config import model_config_class
    from pentad.training.optim import build_optimizer  # noqa: F401  (the trainer's AdamW)

    torch.manual_seed(0)
    model = build_model(model_config_class().model_validate(model_dict(name, args)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def batch(args: argparse.Namespace):
    from pentad.components.base import Batch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    return Batch(tokens=tokens, labels={"lm": tokens})


def step(model, optimizer, data, mode: str) -> None:
    from pentad.model import total_loss

    if mode == "train":
        model.train()
        loss = total_loss(model(data))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    else:
        model.eval()
        with torch.inference_mode():
            total_loss(model(data))


def timed(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from pentad.model import count_active_parameters, count_parameters

    built = {name: build(name, args) for name in MODELS}
    data = batch(args)
    out: dict[str, dict[str, float]] = {}
    for name, (model, _) in built.items():
        out[name] = {"params": count_parameters(model), "active": count_active_parameters(model)}
    for mode in ("train", "infer"):
        times: dict[str, list[float]] = {name: [] for name in MODELS}
        for name in MODELS:  # warmup
            step(*built[name], data, mode)
        for rep in range(args.reps):
            order = MODELS[rep % len(MODELS):] + MODELS[:rep % len(MODELS)]
            for name in order:
                start = time.perf_counter()
                step(*built[name], data, mode)
                times[name].append(time.perf_counter() - start)
        for name in MODELS:
            out[name][f"{mode}_tokens_per_s"] = args.batch * args.seq / statistics.median(times[name])
    return out


def peak_memory(name: str, mode: str, args: argparse.Namespace) -> float:
    """MiB: peak resident set of a fresh process that builds ``name`` and runs ``mode`` steps, less its
    resident set after importing torch."""
    cmd = [sys.executable, __file__, "--memory-of", name, "--mode", mode, *sys.argv[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"])


def rss_mib() -> float:
    """Peak resident set of this process image so far, MiB. /proc's VmHWM starts afresh at exec;
    getrusage's ru_maxrss does not (a child started by a large parent inherits the parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=384)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--memory-of", choices=MODELS, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("train", "infer"), help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        # one step of a tiny model of the same kind first, so that the baseline holds the code and
        # first-use buffers of torch and pentad and the difference is this model's run
        tiny = argparse.Namespace(**{**vars(args), "layers": 1, "hidden": 16, "heads": 2, "vocab": 32,
                                     "expert_ffn": 8, "batch": 2, "seq": 8})
        step(*build(args.memory_of, tiny), batch(tiny), args.mode)
        base = rss_mib()
        model, optimizer = build(args.memory_of, args)
        data = batch(args)
        for _ in range(3):
            step(model, optimizer, data, args.mode)
        print(json.dumps({"peak_mib": rss_mib() - base}))
        return
    results = timed(args)
    for name in MODELS:
        for mode in ("train", "infer"):
            results[name][f"{mode}_peak_mib"] = peak_memory(name, mode, args)
    print(f"# {platform.processor() or platform.machine()}, python {platform.python_version()}, torch "
          f"{torch.__version__}, {args.threads} thread(s); L{args.layers} H{args.hidden} A{args.heads} V{args.vocab}, "
          f"{args.experts} experts top-{args.top_k} x FF {args.expert_ffn}, batch {args.batch} x {args.seq}")
    print("| model | parameters | active | train tok/s | x dense | infer tok/s | x dense | train peak MiB | "
          "infer peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    dense = results["dense"]
    for name in MODELS:
        r = results[name]
        print(f"| {name} | {r['params']:,} | {r['active']:,} | {r['train_tokens_per_s']:.0f} | "
              f"{r['train_tokens_per_s'] / dense['train_tokens_per_s']:.2f} | {r['infer_tokens_per_s']:.0f} | "
              f"{r['infer_tokens_per_s'] / dense['infer_tokens_per_s']:.2f} | {r['train_peak_mib']:.0f} | "
              f"{r['infer_peak_mib']:.0f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
