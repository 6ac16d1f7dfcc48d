"""``pentad compress RUN --output DIR [--distill ...] [--prune ...] [--quantize int8]``: a smaller, faster
model from a fine-tuned run (:mod:`pentad.compression.pipeline`, docs/compress.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pentad.cli.help import Choices


def _quantize_kinds() -> tuple[str, ...]:
    from pentad.compression.quantize import KINDS

    return KINDS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compress`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "compress", help="distil, prune and quantize a fine-tuned run into a smaller, faster one",
        description="Compress a run, in this order, each step optional: distil a student with fewer layers "
                    "from it (--distill), prune attention heads and feed-forward units by importance, then "
                    "recover by fine-tuning (--prune), quantize the linear layers to int8 (--quantize). DIR is a "
                    "run-like directory that pentad infer and generate read; the intermediate runs are kept in "
                    "DIR/steps/ and DIR/compress.json lists each step's dev score and size. --distill and --prune "
                    "need a fine-tuned run (they train on its task data); any run can be quantized. "
                    "docs/compress.md.")
    p.add_argument("run", type=Path, metavar="RUN", help="a run directory: fine-tuned (pentad finetune) for "
                   "--distill and --prune, any run for --quantize")
    p.add_argument("--output", "-o", "--out", type=Path, required=True, metavar="DIR",
                   help="the directory to write (new, or --overwrite); --out is its former spelling, still accepted")
    p.add_argument("--distill", metavar="layers=N[,...]", help="distil a student with N encoder layers (initialised "
                   "from evenly spaced teacher layers) from RUN: logits, hidden states and attention; optional "
                   "epochs=E, hidden=W, attention=W (transfer weights, default 1), alpha=A, temperature=T")
    p.add_argument("--prune", metavar="heads=F,ffn=F", help="remove this fraction of attention heads and of "
                   "feed-forward units, least important first (gradient importance on the dev data); sparsity=F "
                   "also zeroes this fraction of each linear weight by magnitude")
    p.add_argument("--recover-epochs", type=int, default=1, metavar="N", help="epochs of fine-tuning after "
                   "pruning (0: none)")
    p.add_argument("--data", type=Path, metavar="FILE", help="labelled file to score importance on (default: the "
                   "run's data.dev)")
    p.add_argument("--quantize", choices=Choices(_quantize_kinds), metavar="KIND", help="%(choices)s: int8 "
                   "weights (per output channel) and dynamic int8 activations in every linear layer not tied to an "
                   "embedding (CPU inference)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    p.add_argument("--set", action="append", default=[], metavar="key.path=value", dest="overrides",
                   help="a config override for the fine-tuning steps (repeat: --set train.threads=2 --set "
                   "train.batch_size=16)")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.cli.paths import check_writable
    from pentad.compression.pipeline import CompressOptions, compress, parse_distill
    from pentad.compression.prune import parse_prune

    check_writable(args.output, "--output")
    options = CompressOptions(distill=parse_distill(args.distill) if args.distill is not None else None,
                              prune=parse_prune(args.prune) if args.prune is not None else None,
                              recover_epochs=args.recover_epochs, quantize=args.quantize, data=args.data,
                              overrides=list(args.overrides))
    print(compress(args.run, args.output, options, overwrite=args.overwrite).render(), flush=True)
    return 0
