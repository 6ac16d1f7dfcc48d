"""CPU seconds per step of three fixed transformer workloads on one thread, to compare two source trees.

* ``bert-train``: ``bert/mini`` (L4 H256), MLM + NSP, train mode (dropout on: the explicit attention path
  with pentad's CPU dropout), forward + backward.
* ``gpt2-train``: ``gpt2/base`` cut to 4 layers of width 256, causal LM, forward + backward.
* ``gpt2-eval``: the same model in eval mode under ``no_grad`` (SDPA's fused causal kernel).

Batch 8 x 128 tokens, one warm-up step, the mean of ``--steps`` timed steps. Process CPU time on one
thread moves less than wall-clock time on a machine shared with other jobs; run the two trees
alternately several times and compare medians, e.g. with the tree before a change extracted by
``git archive <commit> src | tar -x -C ../before``::

    for i in 1 2 3 4; do
      PYTHONPATH=../before/src .venv/bin/python bench/transformer_step_cpu.py
      PYTHONPATH=src .venv/bin/python bench/transformer_step_cpu.py
    done
"""

from __future__ import annotations

import argparse
import time

import torch

from pentad.assembly import load_config
from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.model import total_loss

GPT2 = ["model.hidden_size=256", "model.encoder.num_layers=4", "model.encoder.num_heads=4",
        "model.encoder.ffn_size=1024"]
WORKLOADS = (("bert-train", "bert/mini", [], True), ("gpt2-train", "gpt2/base", GPT2, True),
             ("gpt2-eval", "gpt2/base", GPT2, False))


def seconds_per_step(recipe: str, overrides: list[str], train: bool, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model(load_config(recipe, overrides).model).train(train)
    tokens = torch.randint(5, 1000, (8, 128))
    bert = "mlm" in model.targets
    labels = {"mlm": tokens.clone(), "sp": torch.zeros(8, dtype=torch.long)} if bert else {"lm": tokens.clone()}
    batch = Batch(tokens=tokens, segments=torch.zeros_like(tokens) if bert else None, labels=labels)

    def step() -> None:
        if train:
            model.zero_grad(set_to_none=True)
            total_loss(model(batch)).backward()
        else:
            with torch.no_grad():
                model(batch)

    step()
    start = time.process_time()
    for _ in range(steps):
        step()
    return (time.process_time() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per workload")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(" ".join(f"{name}={seconds_per_step(recipe, overrides, train, args.steps):.4f}"
                   for name, recipe, overrides, train in WORKLOADS), flush=True)


if __name__ == "__main__":
    main()
