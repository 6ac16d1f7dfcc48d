"""``pentad`` entry point: one subcommand per user action; user errors exit with status 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pentad import __version__
from pentad.errors import Interrupted, UserError

KINDS = ("embeddings", "encoders", "decoders", "targets", "objectives", "tasks", "tokenizers", "zoo")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML/JSON file, zoo recipe (e.g. bert/tiny) or TencentPretrain JSON")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.add_argument("--print-config", action="store_true", help="print the fully resolved config and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pentad", description="Pre-train and fine-tune five-slot models.")
    parser.add_argument("--version", action="version", version=f"pentad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("preprocess", help="tokenize a corpus into memory-mapped token shards")
    _config_args(p)
    p = sub.add_parser("pretrain", help="pre-train a model on a preprocessed dataset")
    _config_args(p)
    p = sub.add_parser("finetune", help="fine-tune on a downstream task")
    p.add_argument("--task", help="task name (e.g. classification); sets task.type")
    _config_args(p)
    p = sub.add_parser("infer", help="predict with a fine-tuned run directory")
    p.add_argument("--task", help="task name; must match the run's task")
    p.add_argument("--model", required=True, type=Path, help="fine-tuned run directory")
    p.add_argument("--output", "-o", type=Path, help="predictions file (default: MODEL/predictions.tsv)")
    p.add_argument("--probabilities", action="store_true", help="also write class probabilities")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("overrides", nargs="*", metavar="data.test=FILE", help="the input file as data.test=FILE")
    p = sub.add_parser("validate", help="check a config without running it and print the model summary")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", metavar="key.path=value")
    p.add_argument("--print-config", action="store_true")
    p = sub.add_parser("schema", help="print the JSON Schema of run configs (for editor completion)")
    p = sub.add_parser("list", help="list registered components or zoo recipes")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--table", action="store_true", help="zoo only: the Markdown table of docs/zoo.md "
                   "(modules per slot, objective, parameters, published figure)")
    p = sub.add_parser("vocab", help="vocabulary tools")
    vsub = p.add_subparsers(dest="vocab_command", required=True, metavar="ACTION")
    b = vsub.add_parser("build", help="train a WordPiece or BPE vocabulary on a corpus")
    b.add_argument("--corpus", required=True, nargs="+", type=Path)
    b.add_argument("--kind", choices=("wordpiece", "bpe"), default="wordpiece")
    b.add_argument("--vocab-size", type=int, default=8000)
    b.add_argument("--output", "-o", required=True, type=Path)
    b.add_argument("--cased", action="store_true", help="keep case (default: lower-case)")
    b.add_argument("--min-frequency", type=int, default=2)
    from pentad.cli import convert as convert_cli
    from pentad.cli import generate as generate_cli

    convert_cli.add_parser(sub)
    generate_cli.add_parser(sub)
    p = sub.add_parser("demo", help="pre-train a small BERT on Wikipedia text, fine-tune on movie reviews")
    p.add_argument("--output", "-o", type=Path, default=Path("runs/demo"))
    p.add_argument("--minutes", type=float, default=7.5,
                   help="time budget of the whole demo; pre-training gets what the fine-tunes leave")
    p.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    return parser


def _load(args: argparse.Namespace, extra: Sequence[str] = ()):
    from pentad.config.loader import dump_config, load_config

    cfg = load_config(args.config, list(extra) + list(args.overrides))
    if getattr(args, "print_config", False):
        print(dump_config(cfg), end="")
        return None
    return cfg


def run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "list":
        return _list(args.kind, args.table)
    if cmd == "schema":
        from pentad.config.run import run_config_class

        print(json.dumps(run_config_class().model_json_schema(), indent=2))
        return 0
    if cmd == "validate":
        return _validate(args)
    if cmd == "vocab":
        from pentad.data.vocab_builder import build_vocab

        result = build_vocab(args.corpus, args.kind, args.vocab_size, args.output, lowercase=not args.cased,
                             min_frequency=args.min_frequency)
        print(json.dumps(result, indent=2, default=str))
        return 0
    if cmd == "convert":
        from pentad.cli import convert as convert_cli

        return convert_cli.run(args)
    if cmd == "generate":
        from pentad.cli import generate as generate_cli

        return generate_cli.run(args)
    if cmd == "demo":
        from pentad.demo import run_demo

        run_demo(args.output, minutes=args.minutes, quick=args.quick)
        return 0
    if cmd == "infer":
        from pentad.tasks.runner import infer

        test = None
        for text in args.overrides:
            key, _, value = text.partition("=")
            if key != "data.test" or not value:
                raise UserError(f"infer takes only data.test=FILE, not '{text}'")
            test = Path(value)
        if test is None:
            raise UserError("infer needs the input file: data.test=FILE")
        infer(args.model, test, args.output, args.probabilities or None, args.batch_size)
        return 0
    extra = [f"task.type={args.task}"] if getattr(args, "task", None) else []
    cfg = _load(args, extra)
    if cfg is None:
        return 0
    if cmd == "preprocess":
        from pentad.runs import preprocess_from_config

        preprocess_from_config(cfg)
    elif cmd == "pretrain":
        from pentad.training.pretrain import pretrain

        pretrain(cfg)
    elif cmd == "finetune":
        from pentad.tasks.runner import finetune

        finetune(cfg)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from pentad.builder import build_model, summarize
    from pentad.config.loader import dump_config, load_config
    from pentad.runs import complete_vocab, load_tokenizer

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print(dump_config(cfg), end="")
    if cfg.tokenizer is not None and cfg.model.vocab_size is None:
        complete_vocab(cfg, load_tokenizer(cfg))
    model = build_model(cfg.model, device="meta")
    print(f"config {args.config}: ok")
    print(summarize(model))
    return 0


def _list(kind: str, table: bool = False) -> int:
    if kind == "zoo" and table:
        from pentad.zoo_table import markdown

        print(markdown())
        return 0
    if kind == "zoo":
        from pentad.config.loader import load_config, zoo_names

        for name in zoo_names():
            cfg = load_config(name)
            print(f"{name:24s} {cfg.description or ''}")
        return 0
    from pentad.config.run import run_config_class
    from pentad.registry import ALL

    run_config_class()  # imports every component so that the registries are complete
    registry = ALL[kind]
    for name, cls in registry.items():
        doc = (cls.__doc__ or "").strip().splitlines()
        print(f"{name:16s} {doc[0] if doc else ''}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as e:
        print(f"pentad {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except Interrupted as e:
        print(f"pentad {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
