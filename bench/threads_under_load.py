"""Training speed against intra-op thread settings, on an idle CPU and beside a busy process.

A fine-tuning step (the README quickstart's model: BERT L4 H256 A4, a 21128-word vocabulary,
a classification head, batch 32 x 128, AdamW) is timed in a fresh Python process per setting, so
that environment variables such as ``OMP_WAIT_POLICY`` take effect before torch starts its
OpenMP pool. Each setting runs twice: alone, and with one extra process spinning on one core
(``--busy N`` of them; the "other busy process" of a shared machine). Settings:

* ``before``: torch's default (one thread per core) or ``torch.set_num_threads(1)``, with OpenMP's
  own default wait policy (what pentad did before it set one);
* ``GOMP_SPINCOUNT=10000``: torch's default thread count, threads spin a short while, then sleep;
* ``pentad``: the same thread counts after ``pentad.training.threads.configure_threads``, which
  sets ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep at once instead of spinning) before torch
  starts, as the ``pentad`` command does.

The report gives median seconds per step and the process CPU seconds per step (CPU > wall x
threads means threads were spinning rather than computing). Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/threads_under_load.py               # ~4 min on 2 cores
    PYTHONPATH=src .venv/bin/python bench/threads_under_load.py --steps 6 --busy 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = ["model.hidden_size=256", "model.encoder.num_layers=4", "model.encoder.num_heads=4",
         "model.encoder.ffn_size=1024", "model.vocab_size=21128", "model.max_seq_length=128"]


def worker(threads: int | None, pentad_env: bool, steps: int, batch: int, seq: int) -> dict:
    """Runs in the child process: time ``steps`` training steps after one warm-up step."""
    if pentad_env:
        from pentad.training.threads import configure_threads

        configure_threads(threads)  # before torch starts its pool, as the CLI does
    import torch

    if threads and not pentad_env:
        torch.set_num_threads(threads)

    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.components.base import Batch
    from pentad.model import total_loss
    from pentad.training.optim import build_optimizer

    torch.manual_seed(0)
    cfg = load_config("bert/base", [*SIZES, "model.targets=[{type: cls, num_labels: 2}]"])
    model = build_model(cfg.model, provided={"tokens", "segments", "padding_mask", "labels.cls"})
    model.train()
    optimizer = build_optimizer(model, cfg.train)
    tokens = torch.randint(5, 21128, (batch, seq))
    data = Batch(tokens=tokens, segments=torch.zeros_like(tokens), padding_mask=torch.zeros_like(tokens, dtype=bool),
                 labels={"cls": torch.randint(0, 2, (batch,))})
    walls, cpus = [], []
    for step in range(steps + 1):
        start, cpu = time.perf_counter(), time.process_time()
        loss = total_loss(model(data))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:  # the first step allocates and warms up
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
    return {"threads": torch.get_num_threads(), "wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
            "sec_per_step": statistics.median(walls),
            "cpu_per_step": statistics.median(cpus), "walls": [round(w, 3) for w in walls]}


def spin() -> None:
    """A busy process: one core's worth of pure-Python work until killed."""
    x = 0
    while True:
        x += 1


def run_setting(name: str, threads: int | None, pentad_env: bool, env: dict[str, str], busy: int, args) -> dict:
    busy_procs = [subprocess.Popen([sys.executable, __file__, "--spin"]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0)
        child_env = {**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, **env}
        out = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps([threads, pentad_env, args.steps, args.batch,
                                                               args.seq])],
            env=child_env, capture_output=True, text=True, check=True)
    finally:
        for proc in busy_procs:
            proc.kill()
            proc.wait()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(setting=name, busy=busy, load=os.getloadavg()[0])
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--spin":
        spin()
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--busy", type=int, default=1, help="busy processes in the loaded runs")
    parser.add_argument("--only", nargs="*", help="names of settings to run (default: all)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    settings = [("before, torch default", None, False, {}), ("before, threads=1", 1, False, {}),
                ("pentad default", None, True, {}), ("pentad, threads=1", 1, True, {}),
                ("GOMP_SPINCOUNT=10000", None, False, {"GOMP_SPINCOUNT": "10000"})]
    if args.only:
        settings = [s for s in settings if s[0] in args.only]
    results = []
    print(f"# {platform.processor() or platform.machine()}, {cores} cores, python {platform.python_version()}; "
          f"{args.steps} steps of batch {args.batch} x {args.seq}; load before: {os.getloadavg()[0]:.2f}")
    print("| setting | busy processes | s/step | CPU s/step | load (1 min) |\n|---|---:|---:|---:|---:|")
    for busy in (0, args.busy):
        for name, threads, pentad_env, env in settings:
            r = run_setting(name, threads, pentad_env, env, busy, args)
            results.append(r)
            label = f"{name} ({r['threads']} threads, wait policy {r['wait_policy']})"
            print(f"| {label} | {busy} | {r['sec_per_step']:.2f} | {r['cpu_per_step']:.2f} "
                  f"| {r['load']:.1f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
