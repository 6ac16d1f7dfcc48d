"""``pentad export RUN OUT [--step N] [--overwrite]``: a run's checkpoint (sharded or not) as one
``model.safetensors`` in a run-like directory (:mod:`pentad.training.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "export", help="consolidate a run's checkpoint (fsdp shards or not) into one model.safetensors",
        description="Consolidate the latest (or --step N) checkpoint of a run into OUT/model.safetensors, with "
                    "the run's config.yaml and tokenizer: a directory that pentad finetune init=OUT, pentad "
                    "convert, pentad generate and pentad infer read like a run, and that loads under "
                    "train.strategy=single. Sharded checkpoints (train.strategy=fsdp) are gathered in this "
                    "process, which needs the memory of the whole model.")
    p.add_argument("run", type=Path, metavar="RUN", help="a pre-training or fine-tuning run directory")
    p.add_argument("out", type=Path, metavar="OUT", help="the directory to write (new, or --overwrite)")
    p.add_argument("--step", type=int, help="the checkpoint of this step (default: the latest)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.cli.paths import check_writable
    from pentad.training.export import export_run

    check_writable(args.out, "OUT")
    print(export_run(args.run, args.out, step=args.step, overwrite=args.overwrite).render(), flush=True)
    return 0
