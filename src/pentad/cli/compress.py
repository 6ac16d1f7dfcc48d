"""``pentad compress RUN --out DIR [--distill ...] [--prune ...] [--quantize int8]``: a smaller, faster
model from a fine-tuned run (:mod:`pentad.compression.pipeline`, docs/compress.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compress`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "compress", help="distil, prune and quantize a fine-tuned run into a smaller, faster one",
        description="Compress a fine-tuned run, in this order, each step optional: distil a student with fewer "
                    "layers from it (--distill), prune attention heads and feed-forward units by importance "
                    "then recover by fine-tuning (--prune), quantize the linear layers to int8 (--quantize). "
                    "DIR is a run-like directory that pentad infer and generate read; the intermediate runs are "
                    "kept in DIR/steps/. docs/compress.md.")
    p.add_argument("run", type=Path, metavar="RUN", help="a fine-tuned run directory (pentad finetune)")
    p.add_argument("--out", "-o", type=Path, required=True, metavar="DIR", help="the directory to write (new, or "
                   "--overwrite)")
    p.add_argument("--quantize", choices=("int8",), help="int8 weights (per output channel) and dynamic int8 "
                   "activations in every linear layer not tied to an embedding (CPU inference)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.cli.paths import check_writable
    from pentad.compression.pipeline import CompressOptions, compress

    check_writable(args.out, "--out")
    options = CompressOptions(quantize=args.quantize)
    print(compress(args.run, args.out, options, overwrite=args.overwrite).render(), flush=True)
    return 0
