"""``pentad grow SMALL_RUN --config BIG [key=value ...] --output OUT``: initialise a larger model from a
smaller trained run (hot-start; :mod:`pentad.training.grow`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pentad.cli.help import Choices


def _depth_modes() -> tuple[str, ...]:
    from pentad.training.grow import DEPTH_MODES

    return DEPTH_MODES


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``grow`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "grow", help="initialise a larger model from a smaller trained run (hot-start)",
        description="Grow the weights of SMALL_RUN (its best model, else its latest checkpoint) into the model of "
                    "the big config, which must be the small run's architecture with a larger hidden_size (a whole "
                    "multiple), num_heads (same head size), ffn_size and/or num_layers. Width growth is "
                    "function-preserving; depth growth copies layers (--depth). OUT is a run directory for init=OUT "
                    "(docs/training.md, \"Hot-start\").")
    # one positional list (SMALL_RUN, then overrides), given together: before the options or after all of them
    p.add_argument("items", nargs="+", metavar="SMALL_RUN [key.path=value ...]",
                   help="the trained small run directory, then overrides of the big config")
    p.add_argument("--config", "-c", required=True, help="the big model's config (a YAML file or zoo recipe)")
    p.add_argument("--output", "-o", type=Path, required=True, metavar="OUT",
                   help="the directory to write (new, or --overwrite)")
    p.add_argument("--depth", choices=Choices(_depth_modes), default="stack", metavar="MODE",
                   help="new layers, one of %(choices)s: stack (the small stack repeated: 0 1 0 1), "
                        "interleave (each layer repeated in place: 0 0 1 1), identity (interleave with the copies' "
                        "output projections zero: exact, pre-norm models only)")
    p.add_argument("--noise", type=float, default=0.0, metavar="R",
                   help="add N(0, (R x the weight's std)^2) to the incoming weights of the copied hidden features, "
                        "feed-forward units and heads, so that copies can learn apart (they receive equal gradients "
                        "otherwise); the function then changes by about R. 0: exact copies")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return p


def run(args: argparse.Namespace) -> int:
    from pentad.assembly import load_config
    from pentad.cli.paths import check_writable
    from pentad.outputs import check_apart
    from pentad.training.grow import grow_run

    run_dir, overrides = Path(args.items[0]), list(args.items[1:])
    check_writable(args.output, "--output")
    if Path(args.config).exists():  # (not a zoo recipe's name)
        check_apart(args.output, "--output", [("--config", args.config)])
    cfg = load_config(args.config, overrides)
    print(grow_run(run_dir, cfg, args.output, depth=args.depth, noise=args.noise,
                   overwrite=args.overwrite).render(), flush=True)
    return 0
