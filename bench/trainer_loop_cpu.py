"""CPU seconds per training step of ``pentad pretrain`` (the whole trainer loop: data stream, hooks,
logging, checkpoint decisions, optimizer), to compare two source trees.

A synthetic corpus (random words from a fixed vocabulary, seeded) is turned into a vocabulary and a BERT
dataset once; then ``pentad pretrain`` runs ``--steps`` steps of a tiny BERT (L2 H64) on one thread for
each tree in turn, ``--rounds`` times, alternating, each in a fresh process. Reported: the median of
(child CPU seconds - the same command's CPU seconds at ``--base-steps`` steps) / the step difference, so
start-up and model building cancel, and the ratio of each tree to the first. A model this small makes
the loop's own Python work a large share of a step: a slowdown in the loop shows here first.

    git archive <commit> src | tar -x -C ../before
    .venv/bin/python bench/trainer_loop_cpu.py --trees ../before/src src
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = [f"w{i}" for i in range(400)]
MODEL = ["model.hidden_size=64", "model.max_seq_length=64", "model.encoder.num_layers=2",
         "model.encoder.num_heads=2", "model.encoder.ffn_size=128", "data.objective.seq_length=64"]


def run(tree: str, args: list[str]) -> float:
    """Child CPU seconds of ``python -m pentad ARGS`` importing pentad from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "pentad", *args], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", required=True, help="source folders (each holding the pentad package)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--base-steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trainer-loop-"))
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + " ." for _ in range(4))
            for _ in range(400)]
    (work / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    (work / "lines.txt").write_text("\n".join(d.replace("\n", " ") for d in docs) + "\n", encoding="utf-8")
    first = args.trees[0]
    subprocess.run([sys.executable, "-m", "pentad", "vocab", "build", "--corpus", str(work / "lines.txt"),
                    "--vocab-size", "500", "--min-frequency", "1", "--output", str(work / "vocab")],
                   env={**os.environ, "PYTHONPATH": str(Path(first).resolve())}, check=True,
                   stdout=subprocess.DEVNULL)
    common = ["--config", "bert/tiny", "tokenizer.type=wordpiece", f"tokenizer.vocab={work / 'vocab' / 'vocab.txt'}",
              *MODEL]
    run(first, ["preprocess", *common, f"data.corpus={work / 'corpus.txt'}", f"data.output={work / 'ds'}"])
    train = [*common, f"data.dataset={work / 'ds'}", "train.batch_size=16", "train.threads=1", "train.progress=false",
             "train.tensorboard=false", "train.log_every=10", "train.save_every=100000"]
    per_step: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else list(reversed(args.trees)):
            out = work / f"run-{r}-{abs(hash(tree))}"
            base = run(tree, ["pretrain", *train, f"train.steps={args.base_steps}", f"output={out}-base"])
            full = run(tree, ["pretrain", *train, f"train.steps={args.steps}", f"output={out}"])
            per_step[tree].append((full - base) / (args.steps - args.base_steps))
    reference = statistics.median(per_step[first])
    print(f"CPU seconds per step, tiny BERT, one thread ({args.rounds} rounds, medians):")
    for tree, values in per_step.items():
        median = statistics.median(values)
        print(f"  {tree}: {median * 1000:.2f} ms/step  (rounds: {', '.join(f'{v * 1000:.2f}' for v in values)})"
              f"  ratio to {first}: {median / reference:.3f}")


if __name__ == "__main__":
    main()
