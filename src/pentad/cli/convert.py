"""``pentad convert``: weights and configs between pentad, Hugging Face and TencentPretrain.

    pentad convert hf-to-pentad IN OUT [--family F] [--verify] [--tolerance T] [--revision REV]
    pentad convert pentad-to-hf IN OUT [--family F] [--verify] [--tolerance T] [--allow-norm-change]
    pentad convert tencentpretrain-to-pentad IN OUT [--verify]
    pentad convert pentad-to-tencentpretrain IN OUT [--verify]
    pentad convert ctranslate2-to-hf IN OUT [--verify]
    pentad convert ctranslate2-to-pentad IN OUT [--verify]

Exit status: 0 on success, 1 when ``--verify`` finds a relative difference above the tolerance or a
failed exact check (the output is still written, to inspect), 2 for a user error (raised as
``UserError`` to the entry point).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pentad.conversions import DIRECTIONS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "convert",
        help="convert weights: Hugging Face <-> pentad, TencentPretrain <-> pentad, CTranslate2 Whisper -> "
             "Hugging Face / pentad",
        description="Convert a model directory. hf-to-pentad / tencentpretrain-to-pentad write a pentad run "
                    "directory; pentad-to-hf writes a directory transformers' from_pretrained loads; "
                    "pentad-to-tencentpretrain writes model.bin, config.json and the vocabulary file; "
                    "ctranslate2-to-hf / ctranslate2-to-pentad read a CTranslate2 Whisper directory (model.bin, "
                    "config.json, tokenizer.json).")
    p.add_argument("direction", choices=DIRECTIONS, help="what to convert into what")
    p.add_argument("input", metavar="IN", help="source directory (HF model dir, pentad run dir, a TencentPretrain "
                                               ".bin + JSON config dir, or a CTranslate2 model dir); for "
                                               "hf-to-pentad also a Hugging Face Hub name, ORG/NAME or hf:NAME "
                                               "(optionally @REVISION), read from the Hub's cache or downloaded "
                                               "into it")
    p.add_argument("output", type=Path, metavar="OUT", help="output directory (new or empty)")
    p.add_argument("--family", help="HF model family: {families} (default: from config.json, or recorded/guessed "
                                    "for pentad-to-hf)")
    p.add_argument("--verify", action="store_true",
                   help="Hugging Face: run both models on a sample batch and report max |difference| (absolute and "
                        "relative) per layer and output; TencentPretrain: check bitwise that the output maps back "
                        "to the input, and that the pentad model runs")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest accepted relative difference with --verify: max |Δ| / max |reference| of each "
                        "compared output")
    p.add_argument("--revision", help="hf-to-pentad of a Hub name: the branch, tag or commit to convert "
                                      "(default: main)")
    p.add_argument("--allow-norm-change", action="store_true",
                   help="pentad-to-hf of a model with TencentPretrain's LayerNorm (layernorm_unbiased), which HF "
                        "lacks: write torch's LayerNorm instead and report the measured difference (refused "
                        "without this flag)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``pentad convert``; returns the exit status (UserError propagates to the entry point)."""
    from pentad.errors import UserError
    from pentad.interop import hub
    from pentad.interop.convert import convert

    source: Path | str = args.input
    if args.direction == "hf-to-pentad" and hub.is_hub_name(args.input):
        source = hub.snapshot(args.input, args.revision)
        print(f"{args.input}: {source}", flush=True)
    elif args.revision is not None:
        raise UserError(f"--revision applies to hf-to-pentad of a Hugging Face Hub name; {args.input} is "
                        f"{'a local path' if Path(args.input).exists() else 'not one'}")
    report = convert(args.direction, source, args.output, family=args.family, verify=args.verify,
                     tolerance=args.tolerance, allow_norm_change=args.allow_norm_change)
    print(report.render(), flush=True)
    return 0 if report.ok else 1
