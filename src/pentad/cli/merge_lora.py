"""``pentad merge-lora RUN --output OUT [--base PATH] [--overwrite]``: fold a LoRA run's adapters into
its base weights, as a plain run directory (:mod:`pentad.training.merge`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``merge-lora`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "merge-lora", help="fold a LoRA run's adapters into its base weights (a plain run directory)",
        description="Fold the adapters of a run trained with train.lora (its best model, else its latest "
                    "checkpoint) into the base weights it was trained on, and write OUT: model.safetensors, "
                    "config.yaml without train.lora, the tokenizer and the task state. pentad infer, generate, "
                    "export, convert and init=OUT use it like any run; the base is no longer needed.")
    p.add_argument("run", type=Path, metavar="RUN", help="a run directory trained with train.lora")
    p.add_argument("--output", "-o", type=Path, required=True, metavar="OUT",
                   help="the directory to write (new, or --overwrite)")
    p.add_argument("--base", type=Path, help="the base weights (run directory, checkpoint or .safetensors file) "
                                             "when they moved since the run was trained; they must be the same "
                                             "weights (checked by fingerprint)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.cli.paths import check_writable
    from pentad.training.merge import merge_run

    check_writable(args.output, "--output")
    print(merge_run(args.run, args.output, base=args.base, overwrite=args.overwrite).render(), flush=True)
    return 0
