"""ViT throughput: pentad against Hugging Face's ViTForImageClassification, in one process, and the
image pipeline against what the model consumes.

Both models are built from the same sizes (pentad from ``vit/<size>``; Hugging Face from the
equivalent ``ViTConfig`` with ``attn_implementation="sdpa"``), get the same pixels, labels, dtype
(fp32), thread count and optimizer (pentad's AdamW), and are timed in two modes:

* ``train``: train mode, forward + cross-entropy + backward + AdamW step;
* ``infer``: eval mode under ``no_grad``, forward to the logits.

Repetitions alternate between the libraries (and which goes first); the median is reported as
images/s with the ratio pentad / HF. The pipeline rows time, on the same machine, decoding PNG
files into the task's uint8 arrays (``read``) and building augmented training batches
(``train batches``: random resized crop + flip + normalisation), in images/s of one process:
the loader keeps up when these exceed the model's training images/s. Run from the repository
root (needs ``transformers``, as the test extra installs)::

    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py                 # DeiT-Ti/16 at 224, ~2 min
    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py --size base-16  # ViT-B/16, ~10 min
    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py --profile 10 --threads 1

``--profile N`` prints instead the operators of the two eval forwards (no_grad) as torch.profiler
sees them, N alternating forwards of each, self CPU time per forward in ms: CPU time, unlike wall
time, hardly moves when other jobs share the cores, so it compares the work the libraries do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SIZES = {"tiny-16": (192, 12, 3, 768, 16), "base-16": (768, 12, 12, 3072, 16), "base-32": (768, 12, 12, 3072, 32)}


def build(size: str, labels: int):
    from transformers import ViTConfig, ViTForImageClassification

    from pentad.builder import build_model
    from pentad.config.loader import load_config

    hidden, layers, heads, ffn, patch = SIZES[size]
    cfg = load_config(f"vit/{size}", [f"model.targets.0.num_labels={labels}"])
    ours = build_model(cfg.model)
    hf = ViTForImageClassification(ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                             intermediate_size=ffn, patch_size=patch, num_labels=labels,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                             attn_implementation="sdpa"))
    return ours, hf


def step_fn(name: str, model, pixels, labels, train: bool):
    from pentad.components.base import Batch
    from pentad.training.config import TrainConfig
    from pentad.training.optim import build_optimizer

    model.train(train)
    optimizer = build_optimizer(model, TrainConfig(lr=1e-4)) if train else None

    def forward():
        if name == "pentad":
            out = model(Batch(pixels=pixels, labels={"cls": labels} if train else {}))["cls"]
            return out.loss if train else out.logits
        logits = model(pixel_values=pixels).logits
        return torch.nn.functional.cross_entropy(logits, labels) if train else logits

    def run():
        if train:
            forward().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                forward()
    return run


def model_rows(args) -> list[str]:
    torch.manual_seed(0)
    ours, hf = build(args.size, 10)
    pixels = torch.randn(args.batch_size, 3, 224, 224)
    labels = torch.randint(0, 10, (args.batch_size,))
    rows = []
    for mode in ("train", "infer"):
        runs = {"pentad": step_fn("pentad", ours, pixels, labels, mode == "train"),
                "hf": step_fn("hf", hf, pixels, labels, mode == "train")}
        for run in runs.values():
            run()  # warm-up
        times: dict[str, list[float]] = {"pentad": [], "hf": []}
        for rep in range(args.reps):
            for name in (("pentad", "hf") if rep % 2 == 0 else ("hf", "pentad")):
                start = time.perf_counter()
                for _ in range(args.steps):
                    runs[name]()
                times[name].append((time.perf_counter() - start) / args.steps)
        ours_s, hf_s = statistics.median(times["pentad"]), statistics.median(times["hf"])
        rows.append(f"| model {mode} | {args.batch_size / ours_s:.1f} | {args.batch_size / hf_s:.1f} | "
                    f"{hf_s / ours_s:.2f} |")
    return rows


def profile_rows(args) -> list[str]:
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    from pentad.components.base import Batch

    torch.manual_seed(0)
    ours, hf = build(args.size, 10)
    ours.eval()
    hf.eval()
    pixels = torch.randn(args.batch_size, 3, 224, 224)
    forwards = {"pentad": lambda: ours(Batch(pixels=pixels))["cls"].logits,
                "hf": lambda: hf(pixel_values=pixels).logits}
    self_ms: dict[str, Counter] = {"pentad": Counter(), "hf": Counter()}
    calls: dict[str, Counter] = {"pentad": Counter(), "hf": Counter()}
    with torch.no_grad():
        for forward in forwards.values():
            forward()  # warm-up
        for rep in range(args.profile):
            for name in (("pentad", "hf") if rep % 2 == 0 else ("hf", "pentad")):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    forwards[name]()
                for event in prof.key_averages():
                    self_ms[name][event.key] += event.self_cpu_time_total / 1000 / args.profile
                    calls[name][event.key] += event.count / args.profile
    ops = sorted(set(self_ms["pentad"]) | set(self_ms["hf"]), key=lambda op: -self_ms["pentad"][op] - self_ms["hf"][op])
    rows = ["| operator | pentad ms (calls) | HF ms (calls) |", "|---|---:|---:|"]
    for op in ops[:10]:
        rows.append(f"| {op} | {self_ms['pentad'][op]:.1f} ({calls['pentad'][op]:.0f}) | "
                    f"{self_ms['hf'][op]:.1f} ({calls['hf'][op]:.0f}) |")
    rows.append(f"| all | {sum(self_ms['pentad'].values()):.1f} | {sum(self_ms['hf'].values()):.1f} |")
    return rows


def pipeline_rows(args) -> list[str]:
    from PIL import Image

    from pentad.config.loader import load_config
    from pentad.registry import TASKS

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = ["label\tpath"]
        for i in range(args.images):
            Image.fromarray(rng.integers(0, 256, (256, 320, 3), dtype=np.uint8)).save(root / f"{i}.png")
            lines.append(f"{i % 10}\t{i}.png")
        (root / "train.tsv").write_text("\n".join(lines) + "\n")
        cfg = load_config(f"vit/{args.size}", [f"data.train={root / 'train.tsv'}"])
        task = TASKS.get("image_classification")(cfg.task, None, 197)
        task.bind(cfg)
        task.fit(root / "train.tsv")
        start = time.perf_counter()
        instances = task.read(root / "train.tsv")
        read_s = time.perf_counter() - start
        batches = task.train_batches(instances, args.batch_size, seed=0).iterate(0)
        start = time.perf_counter()
        count = 0
        while count < args.images:
            count += next(batches).pixels.shape[0]
        batch_s = time.perf_counter() - start
    return [f"| pipeline read (decode 320x256 PNG + resize) | {args.images / read_s:.0f} | | |",
            f"| pipeline train batches (crop + flip + normalise) | {count / batch_s:.0f} | | |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny-16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=256, help="images the pipeline rows decode")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the eval forwards' operators (N forwards of each) instead of the timings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    print(f"vit/{args.size}, batch {args.batch_size} x 3x224x224, {args.threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, python {sys.version.split()[0]}")
    if args.profile:
        print("\n".join(profile_rows(args)))
        return
    print("| what | pentad images/s | HF images/s | pentad / HF |\n|---|---:|---:|---:|")
    for row in [*model_rows(args), *pipeline_rows(args)]:
        print(row)


if __name__ == "__main__":
    main()
