"""pentad's CPU kernels against torch's own, in one process: dropout and the vocabulary loss.

* **dropout**: forward + backward of ``pentad.layers.dropout.dropout`` against ``F.dropout`` (whose CPU
  mask is ``bernoulli_``) at p = 0.1 on activations [32, 128, 128] and attention probabilities
  [32, 2, 128, 128] (BERT-tiny's at batch 32 x 128), float32 and bfloat16.
* **vocabulary loss**: forward + backward of ``pentad.layers.cross_entropy.linear_cross_entropy`` (fused,
  chunked) against the unfused reference (``F.linear`` + ``F.cross_entropy`` of float32 logits) for
  4,096 rows of width 128 over a 21,128-word vocabulary (the GPT-2 4 x 128 workload of
  ``bench/vs_tencentpretrain.py``), in float32, under bf16 autocast (float32 weights) and with bf16
  weights. bf16 is fast only on CPUs with bf16 matrix units (``lscpu``: ``amx_bf16``).

The variants of a row take turns ``--repeats`` times (so a background load hits all alike); the
median is reported with the ratio reference / pentad (higher is better for pentad). Run from the
repository root::

    PYTHONPATH=src .venv/bin/python bench/cpu_kernels.py
    PYTHONPATH=src .venv/bin/python bench/cpu_kernels.py --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pentad.layers import cross_entropy as ce
from pentad.layers.dropout import dropout
from pentad.training.precision import cpu_has_bf16_units


def timed(fn: Callable[[], None], inner: int) -> float:
    fn()  # warm-up (oneDNN builds its kernels on first use of a shape)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def compare(variants: dict[str, Callable[[], None]], repeats: int, inner: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(variants[name], inner))
    return {name: statistics.median(t) for name, t in times.items()}


def _dropout_pass(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor
                  ) -> Callable[[], None]:
    return lambda: torch.autograd.backward(fn(x), grad)


def dropout_rows(repeats: int) -> list[dict]:
    rows = []
    for shape in ((32, 128, 128), (32, 2, 128, 128)):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, dtype=dtype, requires_grad=True)
            grad = torch.randn(shape, dtype=dtype)
            med = compare({"torch": _dropout_pass(lambda t: F.dropout(t, 0.1, True), x, grad),
                           "pentad": _dropout_pass(lambda t: dropout(t, 0.1), x, grad)}, repeats, inner=10)
            rows.append({"kernel": "dropout p=0.1", "shape": list(shape), "dtype": str(dtype).split(".")[1],
                         "torch_ms": round(1e3 * med["torch"], 2), "pentad_ms": round(1e3 * med["pentad"], 2),
                         "ratio": round(med["torch"] / med["pentad"], 2)})
    return rows


def _loss_pass(loss_fn: Callable[..., tuple[torch.Tensor, ...]], mode: str, tensors: tuple[torch.Tensor, ...],
               labels: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        context = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16 autocast" else contextlib.nullcontext()
        with context:
            loss = loss_fn(*tensors, labels, 0.0)[0]
        torch.autograd.grad(loss, tensors)
    return run


def loss_rows(repeats: int, rows_n: int, width: int, vocab: int) -> list[dict]:
    out = []
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, vocab, (rows_n,), generator=g)
    for mode in ("fp32", "bf16 autocast", "bf16 weights"):
        dtype = torch.bfloat16 if mode == "bf16 weights" else torch.float32
        tensors = (torch.randn(rows_n, width, generator=g).to(dtype).requires_grad_(),
                   (0.05 * torch.randn(vocab, width, generator=g)).to(dtype).requires_grad_(),
                   torch.zeros(vocab, dtype=dtype, requires_grad=True))
        med = compare({"torch": _loss_pass(ce._reference, mode, tensors, labels),
                       "pentad": _loss_pass(ce.linear_cross_entropy, mode, tensors, labels)}, repeats, inner=2)
        out.append({"kernel": "linear + cross-entropy", "shape": [rows_n, width, vocab], "dtype": mode,
                    "torch_ms": round(1e3 * med["torch"], 1), "pentad_ms": round(1e3 * med["pentad"], 1),
                    "ratio": round(med["torch"] / med["pentad"], 2)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=21128)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = dropout_rows(args.repeats) + loss_rows(args.repeats, args.rows, args.width, args.vocab)
    result = {"machine": f"{platform.machine()}, {torch.backends.cpu.get_cpu_capability()}, bf16 matrix units: "
              f"{cpu_has_bf16_units()}", "torch": torch.__version__, "threads": args.threads, "rows": rows}
    print("| kernel | shape | dtype | torch ms | pentad ms | torch / pentad |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {' x '.join(map(str, r['shape']))} | {r['dtype']} | {r['torch_ms']} | "
              f"{r['pentad_ms']} | {r['ratio']}x |")
    print(result["machine"], "torch", result["torch"], "threads", args.threads, file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
