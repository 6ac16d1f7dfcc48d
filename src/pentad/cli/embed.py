"""``pentad embed RUN --input FILE``: pooled sentence vectors (.npy) of a text file from any run's encoder,
optionally BERT-whitened; ``--similarity``: the cosine similarity of each text_a/text_b pair; ``--images``:
image vectors from a ViT or a two-tower run's image stream (:mod:`pentad.tasks.embed`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, get_args

from pentad.errors import UserError
from pentad.layers.pooling_kinds import PoolingKind


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``embed`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "embed", help="sentence vectors (or pair similarities) from a run's encoder",
        description="Encode each text of --input (one text per line, or a TSV whose header names text_a) with the "
                    "encoder of RUN (a pre-training run, a fine-tuned run of any task, a converted checkpoint), pool "
                    "the token states into one vector per text and write them as OUT (.npy, float32 [N, dim]) with "
                    "a JSON description beside it (OUT with .json). --similarity reads text_a/text_b pairs instead "
                    "and writes each pair's cosine similarity (a TSV with header 'similarity'), with Spearman's and "
                    "Pearson's correlation when the file has a label column. --images reads a TSV of image files "
                    "(header naming 'path') and writes their vectors from a ViT/BEiT run or from a two-tower "
                    "(CLIP-style) run's image stream.")
    p.add_argument("run", type=Path, metavar="RUN", help="a run directory")
    p.add_argument("--input", "-i", required=True, type=Path, help="the texts (or pairs, with --similarity)")
    p.add_argument("--output", "-o", type=Path, help="default: RUN/embeddings.npy (RUN/similarity.tsv with "
                   "--similarity)")
    p.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    p.add_argument("--pooling", choices=get_args(PoolingKind),
                   help="default: the run's own (a two-stream run's; images: the cls head's or the image "
                   "stream's), else mean")
    p.add_argument("--whitening", action="store_true", help="BERT-whitening: subtract the mean and decorrelate to "
                   "unit variance (fitted on the input's texts unless --whitening-fit)")
    p.add_argument("--whitening-dim", type=int, metavar="K", help="keep the K directions of largest variance")
    p.add_argument("--whitening-fit", type=Path, metavar="FILE", help="fit the whitening on these texts instead")
    p.add_argument("--similarity", action="store_true", help="score text_a/text_b pairs by cosine similarity")
    p.add_argument("--images", action="store_true", help="--input is a TSV of image files (a header naming 'path'; "
                   "paths relative to it): image vectors from a ViT or a two-tower run's image stream")
    p.add_argument("--projected", action="store_true", help="a two-stream run with a clr head (CLIP): the head's "
                   "projected, L2-normalised features (what retrieval compares) instead of pooled states")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="texts (or pairs, images) encoded together")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when there is a GPU, "
                   "else cpu")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``pentad embed``; prints the output's JSON description."""
    from pentad.cli.paths import claim_output_file
    from pentad.tasks.embed import check_options, embed_file, sidecar_path

    check_options(args.whitening, args.whitening_dim, args.whitening_fit, args.batch_size)
    output = args.output or args.run / ("similarity.tsv" if args.similarity else "embeddings.npy")
    if output.suffix == ".json":
        raise UserError(f"--output {output}: the .json name is taken by the description written beside the output; "
                        f"name the {'similarities' if args.similarity else 'vectors'} file otherwise "
                        f"(e.g. {output.with_suffix('.tsv' if args.similarity else '.npy')})")
    if not args.similarity and output.suffix != ".npy":
        raise UserError(f"--output {output}: vectors are written in NumPy's .npy format; give a name ending in .npy")
    inputs = [("run directory", args.run), ("--input", args.input), ("--whitening-fit", args.whitening_fit)]
    with claim_output_file(output, args.overwrite, "--output", inputs, "pentad embed"), \
            claim_output_file(sidecar_path(output), args.overwrite, "--output", inputs, "pentad embed"):
        description = embed_file(args.run, args.input, output, args.pooling, args.whitening, args.whitening_dim,
                                 args.whitening_fit, args.batch_size, args.similarity, args.device,
                                 images=args.images, projected=args.projected)
    print(json.dumps(description, indent=2, ensure_ascii=False), flush=True)
    return 0
