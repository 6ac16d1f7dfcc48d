"""ViT throughput: pentad against Hugging Face's ViTForImageClassification, in one process, and the
image pipeline against what the model consumes.

Both models are built from the same sizes (pentad from ``vit/<size>``; Hugging Face from the
equivalent ``ViTConfig`` with ``attn_implementation="sdpa"``), get the same pixels, labels, dtype
(fp32), thread count and optimizer (pentad's AdamW), and are timed in two modes:

* ``train``: train mode, forward + cross-entropy + backward + AdamW step;
* ``infer``: eval mode under ``no_grad``, forward to the logits.

pentad is timed twice: with every position through the last layer (``Model.forward`` with
``Model.all_positions`` set), and with its last layer computing the CLS row alone
(``run_stream(output_positions=leading_positions(targets))`` then the head: the only row the ``cls``
head with ``first`` pooling reads; the same logits and gradients to fp32 rounding; what
``Model.forward`` does by default, and so what fine-tuning and inference run).
Repetitions rotate between the three (each goes first in turn); the medians are reported as
images/s (wall) and CPU ms per step (``time.process_time``, all threads of the process), each
with HF's over this one's: CPU time moves much less than wall time when other jobs share the cores.

The pipeline rows time, on the same machine, decoding PNG files into the task's uint8 arrays
(``read``, once per run) and the training batches of the ``image_classification`` task
(``EpochBatches``: random resized crop + flip + normalisation) built in the training process
(0 workers) or in 1 or 2 loader worker processes (``data.loader_workers``), in images/s, with the
training process's CPU per image and the multiple of the model's training images/s (pentad, last
layer at CLS). Run from the repository root (needs ``transformers``, as the test extra installs)::

    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py                 # DeiT-Ti/16 at 224, ~4 min
    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py --size base-16  # ViT-B/16, ~20 min
    PYTHONPATH=src .venv/bin/python bench/vision_throughput.py --profile 4 --mode train --threads 1

``--profile N`` prints instead the operators of N steps of each (``--mode infer`` or ``train``) as
torch.profiler sees them, self time per step in ms (the profiler's times are wall times of each
operator: a loaded machine inflates them).
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


def build(size: str, labels: int, layers: int | None = None):
    from transformers import ViTConfig, ViTForImageClassification

    from pentad.assembly import load_config
    from pentad.builder import build_model

    hidden, depth, heads, ffn, patch = SIZES[size]
    layers = layers or depth
    cfg = load_config(f"vit/{size}", [f"model.targets.0.num_labels={labels}", f"model.encoder.num_layers={layers}"])
    ours = build_model(cfg.model)
    hf = ViTForImageClassification(ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                             intermediate_size=ffn, patch_size=patch, num_labels=labels,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                             attn_implementation="sdpa"))
    return ours, hf


NAMES = {"pentad": "pentad", "pentad-cls": "pentad, last layer at CLS", "hf": "HF"}


def step_fn(name: str, model, pixels, labels, train: bool):
    """One step of ``name``: ``pentad`` (``Model.forward`` at every position), ``pentad-cls`` (the same model through
    ``run_stream(output_positions=leading_positions(targets))`` and its head: the last layer computes
    the CLS row alone, the only one the head reads) or ``hf``."""
    from pentad.components.base import Batch, leading_positions
    from pentad.components.stream import run_stream
    from pentad.training.config import TrainConfig
    from pentad.training.optim import build_optimizer

    model.train(train)
    optimizer = build_optimizer(model, TrainConfig(lr=1e-4)) if train else None

    def forward():
        if name == "pentad":
            model.all_positions = True  # every row through the last layer, as before the CLS-only default
            try:
                out = model(Batch(pixels=pixels, labels={"cls": labels} if train else {}))["cls"]
            finally:
                model.all_positions = False
            return out.loss if train else out.logits
        if name == "pentad-cls":
            batch = Batch(pixels=pixels, labels={"cls": labels} if train else {})
            hidden, _ = run_stream(model.embedding, model.encoder, batch,
                                   output_positions=leading_positions(model.targets.values()))
            out = model.targets["cls"](hidden, batch)
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


def model_rows(args) -> tuple[list[str], float]:
    """The timing rows, and pentad's (last layer at CLS) training images/s."""
    torch.manual_seed(0)
    ours, hf = build(args.size, 10, args.layers)
    models = {"pentad": ours, "pentad-cls": ours, "hf": hf}
    pixels = torch.randn(args.batch_size, 3, 224, 224)
    labels = torch.randint(0, 10, (args.batch_size,))
    rows = []
    consumed = 0.0
    for mode in ("train", "infer"):
        runs = {name: step_fn(name, model, pixels, labels, mode == "train") for name, model in models.items()}
        for run in runs.values():
            run()  # warm-up
        wall: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        order = list(runs)
        for rep in range(args.reps):
            for name in order[rep % 3:] + order[:rep % 3]:  # each goes first in turn
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    runs[name]()
                wall[name].append((time.perf_counter() - start) / args.steps)
                cpu[name].append((time.process_time() - start_cpu) / args.steps)
        hf_s, hf_cpu = statistics.median(wall["hf"]), statistics.median(cpu["hf"])
        for name in ("pentad", "pentad-cls", "hf"):
            ours_s, ours_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
            rows.append(f"| model {mode}: {NAMES[name]} | {args.batch_size / ours_s:.1f} | {hf_s / ours_s:.2f} | "
                        f"{ours_cpu * 1000:.0f} | {hf_cpu / ours_cpu:.2f} |")
            if mode == "train" and name == "pentad-cls":
                consumed = args.batch_size / ours_s
    return rows, consumed


def profile_rows(args) -> list[str]:
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    ours, hf = build(args.size, 10, args.layers)
    models = {"pentad": ours, "pentad-cls": ours, "hf": hf}
    pixels = torch.randn(args.batch_size, 3, 224, 224)
    labels = torch.randint(0, 10, (args.batch_size,))
    train = args.mode == "train"
    runs = {name: step_fn(name, model, pixels, labels, train) for name, model in models.items()}
    self_ms: dict[str, Counter] = {name: Counter() for name in runs}
    calls: dict[str, Counter] = {name: Counter() for name in runs}
    for run in runs.values():
        run()  # warm-up
    order = list(runs)
    for rep in range(args.profile):
        for name in order[rep % 3:] + order[:rep % 3]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runs[name]()
            for event in prof.key_averages():
                self_ms[name][event.key] += event.self_cpu_time_total / 1000 / args.profile
                calls[name][event.key] += event.count / args.profile
    ops = sorted(set().union(*self_ms.values()), key=lambda op: -sum(self_ms[name][op] for name in runs))
    rows = [f"{args.mode} step, self CPU ms per step (calls)",
            "| operator | " + " | ".join(NAMES[name] for name in runs) + " |", "|---|---:|---:|---:|"]
    for op in ops[:args.top]:
        rows.append(f"| {op} | " + " | ".join(f"{self_ms[name][op]:.1f} ({calls[name][op]:.0f})" for name in runs)
                    + " |")
    rows.append("| all | " + " | ".join(f"{sum(self_ms[name].values()):.1f}" for name in runs) + " |")
    return rows


def pipeline_rows(args, consumed: float) -> list[str]:
    """The image pipeline of the ``image_classification`` task: decoding (``read``), then the training
    batches (``EpochBatches``, the loader training iterates) with 0, 1 and 2 worker processes, against
    ``consumed``, the model's training images/s."""
    from PIL import Image

    from pentad.assembly import load_config
    from pentad.registry import TASKS

    rng = np.random.default_rng(0)
    rows = []
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
        rows.append(f"| pipeline read (decode 320x256 PNG + resize, once per run) | {args.images / read_s:.0f} | | | |")
        for workers in (0, 1, 2):
            batches = task.train_batches(instances, args.batch_size, seed=0)
            batches.num_workers = workers
            stream = batches.iterate(0)
            start = time.perf_counter()
            next(stream)  # the first batch also starts the workers
            first_s = time.perf_counter() - start
            start, start_cpu, count = time.perf_counter(), time.process_time(), 0
            while count < 2 * args.images:
                count += next(stream).pixels.shape[0]
            rate = count / (time.perf_counter() - start)
            main_cpu = (time.process_time() - start_cpu) / count * 1000
            share = f", {rate / consumed:.0f}x training" if consumed else ""
            rows.append(f"| pipeline train batches, {workers} workers (crop + flip + normalise; first batch "
                        f"{first_s * 1000:.0f} ms; training process {main_cpu:.2f} CPU ms/image{share}) | "
                        f"{rate:.0f} | | | |")
            del stream
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny-16")
    parser.add_argument("--layers", type=int, default=None, help="encoder layers (default: the size's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=256, help="images the pipeline rows decode")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the operators of N steps of each (--mode) instead of the timings")
    parser.add_argument("--mode", choices=("infer", "train"), default="infer", help="the step --profile runs")
    parser.add_argument("--top", type=int, default=10, help="operators --profile lists")
    parser.add_argument("--pipeline-only", action="store_true", help="only the pipeline rows (no model timings)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    print(f"vit/{args.size}, batch {args.batch_size} x 3x224x224, {args.threads} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, python {sys.version.split()[0]}")
    if args.profile:
        print("\n".join(profile_rows(args)))
        return
    print("| what | images/s | HF wall / this wall | CPU ms per step | HF CPU / this CPU |\n|---|---:|---:|---:|---:|")
    rows, consumed = ([], 0.0) if args.pipeline_only else model_rows(args)
    for row in [*rows, *pipeline_rows(args, consumed)]:
        print(row, flush=True)


if __name__ == "__main__":
    main()
