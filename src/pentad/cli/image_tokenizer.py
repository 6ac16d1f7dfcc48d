"""``pentad image-tokenizer fit --images DIR --output FILE``: fit the k-means patch codebook whose ids are
BEiT's visual tokens; ``pentad image-tokenizer import --codebook FILE``: use a codebook made elsewhere
(:mod:`pentad.data.image_tokenizer`, docs/vision.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pentad.data.config import DEFAULT_MAX_IMAGE_PIXELS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``image-tokenizer`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser("image-tokenizer", help="fit an image tokenizer (a k-means codebook of image patches)")
    sub = p.add_subparsers(dest="image_tokenizer_command", required=True, metavar="ACTION")
    f = sub.add_parser("fit", help="fit a codebook on a folder of images or an image corpus",
                       description="Decode the images at --image-size (Pillow, bicubic, as pentad preprocess does), "
                                   "sample at most --max-patches of their patches and fit --codebook-size centroids "
                                   "with mini-batch k-means, seeded. Writes one safetensors file (the codebook and "
                                   "its options), the data.objective.image_tokenizer of objective beit.")
    f.add_argument("--images", required=True, type=Path, help="a folder of images (searched recursively) or a corpus "
                   "file with a 'path' column (TSV with a header line) or JSON lines with a \"path\" key")
    f.add_argument("--output", "-o", required=True, type=Path, help="the file to write (.safetensors)")
    f.add_argument("--image-size", type=int, nargs="+", default=[224], metavar="SIZE",
                   help="height [width] the images are resized to (the objective's image_size)")
    f.add_argument("--patch-size", type=int, default=16, metavar="N", help="patch side in pixels (the model's)")
    f.add_argument("--codebook-size", type=int, default=8192, metavar="K", help="visual tokens (the model's "
                   "vocab_size)")
    f.add_argument("--channels", type=int, choices=(1, 3), default=3, help="3 (RGB) or 1 (grayscale)")
    f.add_argument("--seed", type=int, default=0, help="seed of the patch sample and of k-means")
    f.add_argument("--max-patches", type=int, default=200_000, metavar="N",
                   help="patches sampled to fit on (bounds memory)")
    f.add_argument("--steps", type=int, default=200, metavar="N", help="mini-batch k-means steps")
    f.add_argument("--batch-size", type=int, default=2048, metavar="N", help="patches per k-means step")
    f.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_IMAGE_PIXELS, metavar="N",
                   help="refuse an image that declares more pixels (width x height; a decompression bomb guard; "
                   "as data.max_image_pixels)")
    f.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    i = sub.add_parser("import", help="turn a codebook made elsewhere into a pentad image tokenizer",
                       description="Read centroids [K, P*P*C] from a .npy file (no pickle) or a safetensors file with "
                                   "one tensor, rescale them to pentad's 0..1 pixel units and its (row, column, "
                                   "channel) patch layout, and write the image tokenizer file that "
                                   "data.objective.image_tokenizer names.")
    i.add_argument("--codebook", required=True, type=Path, help="the centroids, one per row (.npy or .safetensors)")
    i.add_argument("--output", "-o", required=True, type=Path, help="the file to write (.safetensors)")
    i.add_argument("--patch-size", type=int, required=True, metavar="N", help="patch side in pixels")
    i.add_argument("--channels", type=int, choices=(1, 3), default=3, help="3 (RGB) or 1 (grayscale)")
    i.add_argument("--layout", choices=("hwc", "chw"), default="hwc", help="how a row flattens a patch: hwc (row, "
                   "column, channel) or chw (channel first)")
    i.add_argument("--pixel-range", choices=("0-1", "0-255", "symmetric"), default="0-1",
                   help="the units of the centroids' numbers: 0-1, 0-255, or symmetric (-1..1)")
    i.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.cli.paths import claim_output_file

    source = ("--images", args.images) if args.image_tokenizer_command == "fit" else ("--codebook", args.codebook)
    with claim_output_file(args.output, args.overwrite, "--output", [source],
                           f"pentad image-tokenizer {args.image_tokenizer_command}"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from pentad.data.image_tokenizer import fit_on_files, import_codebook
    from pentad.errors import UserError

    if args.image_tokenizer_command == "import":
        if args.patch_size < 1:
            raise UserError(f"--patch-size must be positive, found {args.patch_size}")
        tokenizer = import_codebook(args.codebook, args.patch_size, args.channels, args.layout, args.pixel_range)
        tokenizer.save(args.output)
        print(json.dumps({"output": str(args.output), **tokenizer.metadata()}, indent=2))
        return 0
    if len(args.image_size) > 2:
        raise UserError(f"--image-size takes one size or height and width, found {len(args.image_size)} numbers")
    for name in ("patch_size", "codebook_size", "max_patches", "steps", "batch_size", "max_image_pixels"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be positive, found {getattr(args, name)}")
    size = (args.image_size[0], args.image_size[-1])
    tokenizer = fit_on_files(args.images, args.output, size, args.patch_size, args.codebook_size, args.channels,
                             args.seed, args.max_patches, args.steps, args.batch_size,
                             args.max_image_pixels)
    print(json.dumps({"output": str(args.output), **tokenizer.metadata()}, indent=2))
    return 0
