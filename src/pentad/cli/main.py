"""``pentad`` entry point: one subcommand per user action; user errors exit with status 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pentad import __version__
from pentad.cli.help import Choices, Parser
from pentad.cli.paths import check_run_dir, claim_output_file
from pentad.errors import Interrupted, UserError, write_error_message
from pentad.registry import ALL

KINDS = (*ALL, "zoo")  # what `pentad list` lists: every registry, and the zoo


CONFIG_HELP = ("YAML/JSON file, zoo recipe FAMILY/SIZE (e.g. bert/tiny; families: {zoo}; pentad list zoo) or "
               "TencentPretrain JSON")

# The keys a user sets most often per command (tests check that each exists in the schema).
MAIN_KEYS: dict[str, list[tuple[str, str]]] = {
    "preprocess": [
        ("data.corpus", "the raw text corpus (format set by the objective)"),
        ("data.output", "the dataset directory to create (new or empty)"),
        ("data.objective", "bert, mlm, lm, t5, bart, ... (pentad list objectives); .seq_length, .mask_prob"),
        ("tokenizer.type", "wordpiece, bpe, sentencepiece, char, ... (pentad list tokenizers); tokenizer.vocab=FILE"),
        ("data.workers", "tokenizing processes (default 1)"),
        ("data.on_bad_line", "fail (default) or skip lines that are not UTF-8 or not in the format"),
    ],
    "pretrain": [
        ("data.dataset", "a directory written by pentad preprocess"),
        ("output", "the run directory (running again resumes from its latest checkpoint)"),
        ("train.steps", "optimizer steps (default 1000)"),
        ("train.batch_size", "sequences per micro-batch (default 32); train.grad_accum to accumulate"),
        ("train.lr", "peak learning rate (default 1e-4); train.warmup, train.schedule"),
        ("train.save_every", "checkpoint interval in steps"),
        ("train.threads", "CPU threads (default: one per core)"),
        ("train.device", "auto (default), cpu or cuda; train.precision: auto, fp32, tf32, bf16, bf16-true, fp16"),
        ("init", "start from the weights of a run directory or checkpoint"),
    ],
    "finetune": [
        ("task.type", "classification or ner (or --task); task.num_labels, task.metric"),
        ("data.train", "the training TSV (classification: label<TAB>text_a[<TAB>text_b]; docs/tasks.md)"),
        ("data.dev", "the development TSV: picks the best model"),
        ("data.test", "a test TSV, scored at the end"),
        ("init", "a pre-trained run directory or checkpoint (default: random weights)"),
        ("output", "the run directory"),
        ("train.epochs", "passes over the training set (default 3)"),
        ("train.batch_size", "examples per micro-batch (default 32)"),
        ("train.lr", "peak learning rate (default 1e-4)"),
        ("train.threads", "CPU threads (default: one per core)"),
    ],
}


def _epilog(command: str) -> str:
    width = max(len(key) for key, _ in MAIN_KEYS[command])
    lines = [f"  {key:<{width}}  {text}" for key, text in MAIN_KEYS[command]]
    more = textwrap.fill("`pentad schema` prints every key with its type, default and description (JSON Schema); "
                         "docs/config.md describes the sections, docs/data.md the tokenizers and objectives, "
                         "docs/tasks.md the tasks. --print-config shows the resolved config.", width=100)
    return "main config keys (set in the config file or as key.path=value):\n" + "\n".join(lines) + "\n\n" + more


def _add_run_command(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                          epilog=_epilog(name))


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help=CONFIG_HELP)
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.add_argument("--print-config", action="store_true", help="print the fully resolved config and exit")


def _overwrite_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true", help="start afresh when the output directory holds an "
                   "earlier run (its checkpoints, best model, metrics and results are deleted); without it, an "
                   "earlier run is resumed; sets train.overwrite")


def _vocab_kinds() -> tuple[str, ...]:
    from pentad.data.vocab_builder import KINDS as VOCAB_KINDS

    return VOCAB_KINDS


def _run_items(p: argparse.ArgumentParser, rest: str) -> None:
    """``RUN`` then ``key=value`` items (one positional list, as argparse cannot tell them apart), and
    ``--model RUN``, the former spelling of RUN (:func:`take_run`)."""
    p.add_argument("overrides", nargs="*", metavar="RUN data.test=FILE", help="the fine-tuned run directory, then "
                   + rest)
    p.add_argument("--model", type=Path, metavar="RUN", help="the run directory as an option: the former spelling "
                   "of RUN, still accepted")


def _task_check_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help="the task the run must be of, checked: {tasks} (default: the run's own, unchecked)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pentad", description="Pre-train and fine-tune five-slot models.")
    parser.add_argument("--version", action="version", version=f"pentad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _add_run_command(sub, "preprocess", "tokenize a corpus into memory-mapped token shards")
    _config_args(p)
    p = _add_run_command(sub, "pretrain", "pre-train a model on a preprocessed dataset")
    _overwrite_arg(p)
    _config_args(p)
    p = _add_run_command(sub, "finetune", "fine-tune on a downstream task")
    _overwrite_arg(p)
    p.add_argument("--task", help="the task: {tasks} (pentad list tasks, docs/tasks.md); sets task.type "
                   "(default: the config's task.type)")
    p.add_argument("--teacher", metavar="RUN", help="distil from this fine-tuned run of the same task; sets "
                   "train.distill.teacher (train.distill.alpha, .temperature, .loss: docs/tasks.md)")
    p.add_argument("--folds", type=int, metavar="K", help="k-fold cross-validation over the training file; sets "
                   "train.folds")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2,...", help="search these values of a config key "
                   "(repeat for several keys; every combination runs); sets train.grid")
    _config_args(p)
    p = sub.add_parser("infer", help="predict with a fine-tuned run directory",
                       usage="pentad infer [-h] RUN data.test=FILE [task.KEY=VALUE ...] [--task TASK] [--output FILE] "
                             "[--overwrite] [--probabilities] [--batch-size N]")
    _run_items(p, "the input file as data.test=FILE, then decoding options the run's task allows as task.KEY=VALUE "
                  "(asr, text2text: task.num_beams=4, task.max_new_tokens=...)")
    _task_check_arg(p)
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="predictions file (default: RUN/predictions.tsv, "
                   "or .json/.jsonl for tasks that write JSON: qa, chid, multiple_choice)")
    p.add_argument("--overwrite", action="store_true", help="replace the predictions file if it exists")
    p.add_argument("--probabilities", action="store_true", help="also write class probabilities")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="examples predicted together")
    p = sub.add_parser("evaluate", help="score a fine-tuned run on a labelled file with its task's metrics",
                       usage="pentad evaluate [-h] RUN data.test=FILE [task.KEY=VALUE ...] [--task TASK] "
                             "[--output FILE] [--overwrite] [--batch-size N]",
                       description="Score a fine-tuned run directory on a labelled file (the format of its dev file) "
                       "with the metrics its task reports on dev during fine-tuning, computed the same way; "
                       "prints them, and writes them as JSON with --output.")
    _run_items(p, "the labelled file as data.test=FILE (multi_task: data.test.NAME=FILE per dataset), then decoding "
                  "options the run's task allows as task.KEY=VALUE (asr, text2text: task.num_beams=4, ...)")
    _task_check_arg(p)
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="also write the metrics to this JSON file")
    p.add_argument("--overwrite", action="store_true", help="replace the metrics file if it exists")
    p.add_argument("--batch-size", type=int, metavar="N", help="examples per batch (default: the run's "
                   "train.batch_size x 2, fine-tuning's evaluation batch size)")
    p = sub.add_parser("validate", help="check a config without running it and print the model summary",
                       usage="pentad validate [-h] (CONFIG | --config CONFIG) [key.path=value ...] [--print-config]")
    p.add_argument("--config", "-c", dest="config_option", metavar="CONFIG",
                   help=CONFIG_HELP + " (or give it first, without --config)")
    p.add_argument("overrides", nargs="*", metavar="CONFIG key.path=value", help="the config, then overrides")
    p.add_argument("--print-config", action="store_true", help="also print the fully resolved config")
    p = sub.add_parser("schema", help="print the JSON Schema of run configs (for editor completion)")
    p = sub.add_parser("list", help="list registered components or zoo recipes")
    p.add_argument("kind", choices=KINDS, help="what to list")
    p.add_argument("--table", action="store_true", help="zoo and tasks: the Markdown table of docs/zoo.md "
                   "(modules per slot, objective, parameters, published figure) or docs/tasks.md")
    p = sub.add_parser("vocab", help="vocabulary tools")
    vsub = p.add_subparsers(dest="vocab_command", required=True, metavar="ACTION")
    b = vsub.add_parser("build", help="train a WordPiece or BPE vocabulary on a corpus")
    b.add_argument("--corpus", required=True, nargs="+", type=Path, metavar="FILE", help="text files, one text per "
                   "line")
    b.add_argument("--kind", choices=Choices(_vocab_kinds), default="wordpiece", metavar="KIND",
                   help="the tokenizer the vocabulary is for, one of %(choices)s: wordpiece (writes vocab.txt) "
                        "or bpe (byte-level, writes vocab.json and merges.txt)")
    b.add_argument("--vocab-size", type=int, default=8000, metavar="N", help="tokens in the vocabulary")
    b.add_argument("--output", "-o", required=True, type=Path, metavar="DIR", help="the directory to write")
    b.add_argument("--cased", action="store_true", help="keep case (default: lower-case)")
    b.add_argument("--min-frequency", type=int, default=2, metavar="N", help="pieces seen fewer times are left out")
    from pentad.cli import chat as chat_cli
    from pentad.cli import compress as compress_cli
    from pentad.cli import convert as convert_cli
    from pentad.cli import data as data_cli
    from pentad.cli import embed as embed_cli
    from pentad.cli import export as export_cli
    from pentad.cli import generate as generate_cli
    from pentad.cli import grow as grow_cli
    from pentad.cli import image_tokenizer as image_tokenizer_cli
    from pentad.cli import merge_lora as merge_lora_cli

    data_cli.add_parser(sub)
    convert_cli.add_parser(sub)
    export_cli.add_parser(sub)
    merge_lora_cli.add_parser(sub)
    grow_cli.add_parser(sub)
    compress_cli.add_parser(sub)
    generate_cli.add_parser(sub)
    chat_cli.add_parser(sub)
    embed_cli.add_parser(sub)
    image_tokenizer_cli.add_parser(sub)
    p = sub.add_parser("demo", help="pre-train a small BERT on Wikipedia text, fine-tune on movie reviews")
    p.add_argument("--output", "-o", type=Path, default=Path("runs/demo"), metavar="DIR",
                   help="the directory of the demo's runs (running again resumes them)")
    p.add_argument("--minutes", type=float, default=7.5,
                   help="time budget of the whole demo, in minutes; pre-training gets what the fine-tunes leave")
    p.add_argument("--quick", action="store_true", help="a much shorter run (smoke test)")
    p.add_argument("--reference-full", action="store_true",
                   help="also fine-tune all-MiniLM-L6-v2 on the whole training set (about 4 more CPU minutes, "
                        "taken from pre-training unless --minutes grows)")
    return parser


def _load(args: argparse.Namespace, extra: Sequence[str] = ()):
    from pentad.assembly import load_config
    from pentad.config.loader import dump_config

    # preprocess checks only what it reads (the model and task sections need torch to check; it does not),
    # unless the whole resolved config is to be printed
    preprocess_only = args.command == "preprocess" and not getattr(args, "print_config", False)
    cfg = load_config(args.config, list(extra) + list(args.overrides), preprocess_only=preprocess_only)
    if getattr(args, "print_config", False):
        print(dump_config(_plan(args.command, cfg)), end="")
        return None
    return cfg


def _plan(command: str, cfg: Any) -> Any:
    """What ``--print-config`` prints: the run as resolved before it starts (what its ``config.yaml``
    records), as far as the config says enough to resolve it (a missing dataset, task input or output is
    left unset rather than refused)."""
    if command == "pretrain":
        from pentad.training.pretrain import plan_pretrain

        return plan_pretrain(cfg, partial=True).cfg
    if command == "finetune":
        from pentad.tasks.runner import plan_finetune, settle_finetune

        if cfg.train.grid or cfg.train.folds:  # each trial and fold is resolved when it runs
            return settle_finetune(cfg, partial=True)
        return plan_finetune(cfg, partial=True).cfg
    return cfg


def grid_option(items: Sequence[str]) -> dict[str, list[Any]]:
    """``--grid KEY=V1,V2`` options as ``train.grid`` (values parsed as YAML, like overrides)."""
    import yaml

    from pentad.config.loader import parse_yaml

    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise UserError(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. --grid train.lr=1e-4,3e-5)")
        parsed = []
        for v in values.split(","):
            try:
                value = parse_yaml(v, f"--grid {key.strip()}") if v.strip() else v
            except yaml.YAMLError:
                value = v
            if isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", value):
                value = float(value)  # 1e-4: a number (YAML 1.1 reads it as text)
            parsed.append(value)
        grid[key.strip()] = parsed
    return grid


# Commands that read run directories, whose configs may name a task: the task union of the run config has
# the tasks registered (pentad.run_config), so these fill every registry first. (pretrain, finetune and
# validate load their config through pentad.assembly.load_config, which does; infer runs the task runner.)
READS_RUNS = frozenset({"convert", "compress", "export", "merge-lora", "grow", "generate", "chat", "embed", "demo"})


def take_run(args: argparse.Namespace) -> None:
    """``infer`` and ``evaluate``: the run directory, the item without ``=`` (``RUN data.test=FILE``), or
    ``--model RUN`` (the former spelling), into ``args.model``; the other items stay overrides."""
    items = list(args.overrides)
    runs = [item for item in items if "=" not in item]
    if len(runs) > 1:
        raise UserError(f"{args.command} takes one run directory, found {', '.join(runs)}; the other items are "
                        "data.test=FILE and task.KEY=VALUE")
    given = runs[0] if runs else None
    if given is not None and args.model is not None:
        raise UserError(f"{args.command}: the run directory is given twice, as {given} and as --model {args.model}; "
                        f"give it once, first: `pentad {args.command} RUN data.test=FILE`")
    if given is None and args.model is None:
        raise UserError(f"{args.command} needs the fine-tuned run directory first: `pentad {args.command} RUN "
                        "data.test=FILE` (RUN: a directory written by pentad finetune)")
    if given is not None:
        args.model, args.overrides = Path(given), [item for item in items if item is not given]


def run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd in ("infer", "evaluate"):
        take_run(args)
    if cmd in READS_RUNS:
        from pentad.assembly import fill_registries

        fill_registries()
    if cmd == "list":
        return _list(args.kind, args.table)
    if cmd == "schema":
        from pentad.assembly import run_config_class

        print(json.dumps(run_config_class().model_json_schema(), indent=2))
        return 0
    if cmd == "validate":
        return _validate(args)
    if cmd == "vocab":
        from pentad.data.vocab_builder import build_vocab
        from pentad.outputs import OutputLock, check_apart

        inputs = [("--corpus file", path) for path in args.corpus]
        check_apart(args.output, "--output", inputs)
        with OutputLock(args.output, "--output", "pentad vocab build"):
            result = build_vocab(args.corpus, args.kind, args.vocab_size, args.output, lowercase=not args.cased,
                                 min_frequency=args.min_frequency)
        print(json.dumps(result, indent=2, default=str))
        return 0
    if cmd == "data":
        from pentad.cli import data as data_cli

        return data_cli.run(args)
    if cmd == "convert":
        from pentad.cli import convert as convert_cli

        return convert_cli.run(args)
    if cmd == "compress":
        from pentad.cli import compress as compress_cli

        return compress_cli.run(args)
    if cmd == "export":
        from pentad.cli import export as export_cli

        return export_cli.run(args)
    if cmd == "merge-lora":
        from pentad.cli import merge_lora as merge_lora_cli

        return merge_lora_cli.run(args)
    if cmd == "grow":
        from pentad.cli import grow as grow_cli

        return grow_cli.run(args)
    if cmd == "generate":
        from pentad.cli import generate as generate_cli

        return generate_cli.run(args)
    if cmd == "chat":
        from pentad.cli import chat as chat_cli

        return chat_cli.run(args)
    if cmd == "image-tokenizer":
        from pentad.cli import image_tokenizer as image_tokenizer_cli

        return image_tokenizer_cli.run(args)
    if cmd == "embed":
        from pentad.cli import embed as embed_cli

        return embed_cli.run(args)
    if cmd == "demo":
        from pentad.demo import run_demo

        run_demo(args.output, minutes=args.minutes, quick=args.quick, reference_full=args.reference_full)
        return 0
    if cmd == "infer":
        from pentad.tasks.runner import infer

        test = None
        task_options: list[str] = []
        for text in args.overrides:
            key, _, value = text.partition("=")
            if key.startswith("task.") and value:
                task_options.append(text)
                continue
            if key != "data.test" or not value:
                raise UserError(f"infer takes data.test=FILE and the run's decoding options as task.KEY=VALUE, "
                                f"not '{text}'")
            test = Path(value)
        if test is None:
            raise UserError("infer needs the input file: data.test=FILE")
        from pentad.tasks.runner import default_predictions

        with claim_output_file(args.output or default_predictions(args.model), args.overwrite, "--output",
                               [("run directory", args.model), ("data.test", test)], "pentad infer"):
            infer(args.model, test, args.output, args.probabilities or None, args.batch_size, task=args.task,
                  task_options=task_options)
        return 0
    if cmd == "evaluate":
        return _evaluate(args)
    extra = [f"task.type={args.task}"] if getattr(args, "task", None) else []
    if getattr(args, "overwrite", False):
        extra.append("train.overwrite=true")
    if getattr(args, "teacher", None):
        extra.append(f"train.distill.teacher={args.teacher}")
    if getattr(args, "folds", None) is not None:
        extra.append(f"train.folds={args.folds}")
    if getattr(args, "grid", None):
        import yaml  # (YAML, not JSON: JSON's 1e-05 would read back as text)

        extra.append("train.grid=" + yaml.safe_dump(grid_option(args.grid), default_flow_style=True, sort_keys=False,
                                                    width=1 << 30).strip())
    cfg = _load(args, extra)
    if cfg is None:
        return 0
    args.loaded_config = cfg
    if cmd in ("pretrain", "finetune") and cfg.output is not None:
        check_run_dir(Path(cfg.output), inputs=[("init", cfg.init), ("data.dataset", cfg.data.dataset),
                                                ("train.distill.teacher", cfg.train.distill.teacher)])
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


def _evaluate(args: argparse.Namespace) -> int:
    """``pentad evaluate``: the run's task metrics on a labelled file, printed (and written as JSON)."""
    from pentad.files import write_json
    from pentad.tasks.runner import evaluate_file

    single: Path | None = None
    named: dict[str, Path] = {}
    task_options: list[str] = []
    for text in args.overrides:
        key, _, value = text.partition("=")
        if key.startswith("task.") and value:
            task_options.append(text)
        elif key == "data.test" and value:
            single = Path(value)
        elif key.startswith("data.test.") and len(key) > len("data.test.") and value:
            named[key[len("data.test."):]] = Path(value)
        else:
            raise UserError(f"evaluate takes the labelled file as data.test=FILE (multi_task: data.test.NAME=FILE) "
                            f"and the run's decoding options as task.KEY=VALUE, not '{text}'")
    if single is None and not named:
        raise UserError("evaluate needs the labelled input file: data.test=FILE")
    if single is not None and named:
        raise UserError(f"evaluate takes either data.test=FILE or data.test.NAME=FILE (one file per dataset of a "
                        f"multi_task run), not both (data.test={single}, data.test.{next(iter(named))}=...)")
    source: Path | dict[str, Path] = single if single is not None else named
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: expected a positive number of examples per batch")
    given = named if single is None else {"": single}
    inputs = [("run directory", args.model), *((f"data.test.{n}" if n else "data.test", p) for n, p in given.items())]
    if args.output is not None:
        from pentad.cli.paths import check_output_file

        check_output_file(args.output, args.overwrite, "--output", inputs)  # before the model is loaded
    metrics = evaluate_file(args.model, source, args.batch_size, task=args.task, task_options=task_options)
    shown = single if single is not None else ", ".join(f"{n}={p}" for n, p in named.items())
    width = max((len(k) for k in metrics), default=0)
    print(f"{shown}:")
    for name, value in metrics.items():
        print(f"  {name:<{width}}  {value:.4f}")
    if args.output is not None:
        with claim_output_file(args.output, args.overwrite, "--output", inputs, "pentad evaluate"):
            write_json(args.output, metrics)
    return 0


def _validate_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(config, overrides) of ``validate``, which takes the config first or as ``--config``."""
    items = list(args.overrides)
    if args.config_option is not None:
        return args.config_option, items
    if not items or ("=" in items[0] and not Path(items[0]).exists()):
        raise UserError("validate needs a config: `pentad validate CONFIG [key=value ...]` or "
                        "`pentad validate --config CONFIG [key=value ...]` (CONFIG: " + CONFIG_HELP + ")")
    return items[0], items[1:]


def _validate(args: argparse.Namespace) -> int:
    from pentad.assembly import load_config
    from pentad.builder import build_model, summarize
    from pentad.config.loader import dump_config
    from pentad.runs import complete_vocab, load_tokenizer

    source, overrides = _validate_source(args)
    cfg = load_config(source, overrides)
    if args.print_config:
        print(dump_config(cfg), end="")
    if cfg.tokenizer is not None and cfg.model.vocab_size is None:
        complete_vocab(cfg, load_tokenizer(cfg))
    model = build_model(cfg.model, device="meta")
    print(f"config {source}: ok")
    print(summarize(model))
    return 0


def _list(kind: str, table: bool = False) -> int:
    if kind == "zoo" and table:
        from pentad.zoo_table import markdown

        print(markdown())
        return 0
    if kind == "tasks":
        from pentad.tasks import catalog

        print(catalog.markdown() if table else catalog.text())
        return 0
    if table:
        raise UserError(f"--table is for `pentad list zoo` and `pentad list tasks`, not {kind}")
    if kind == "zoo":
        from pentad.assembly import load_config
        from pentad.config.loader import zoo_names

        for name in zoo_names():
            cfg = load_config(name)
            print(f"{name:24s} {cfg.description or ''}")
        return 0
    from pentad.assembly import fill_registries

    fill_registries()
    registry = ALL[kind]
    for name, cls in registry.items():
        print(f"{name:16s} {summary(cls.__doc__)}")
    return 0


def summary(doc: str | None, limit: int = 160) -> str:
    """The first paragraph of a docstring as whole sentences on one line: its first sentence, and
    the following ones while they fit in ``limit`` characters. Never cut mid-sentence."""
    paragraph = re.split(r"\n\s*\n", (doc or "").strip())[0]
    text = " ".join(paragraph.split()).replace("``", "")
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z(`\[])", text)
    out = sentences[0]
    for sentence in sentences[1:]:
        if len(out) + 1 + len(sentence) > limit:
            break
        out += " " + sentence
    return out


def _outputs(args: argparse.Namespace) -> list[Path]:
    """The places a command writes to, named when a failed write does not say which file it was."""
    found = [getattr(args, "output", None)]
    cfg = getattr(args, "loaded_config", None)
    if cfg is not None:
        found += [cfg.output, cfg.data.output if args.command == "preprocess" else None]
    if args.command == "infer" and args.output is None:
        from pentad.tasks.runner import default_predictions

        found.append(default_predictions(args.model))
    return [Path(p) for p in found if p is not None and str(p) != "-"]


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line parsed; key=value overrides may also follow options (`infer --model RUN
    data.test=F --output P task.num_beams=4`): argparse leaves such a second run of positionals
    unparsed, and they join the first. Anything else unknown is an error (exit 2)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not isinstance(getattr(args, "overrides", None), list)):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from pentad.training.threads import prepare_environment

    prepare_environment()  # before torch starts its OpenMP pool (pentad.training.threads says why)
    args = parse_arguments(argv)
    try:
        return run(args)
    except UserError as e:
        if not getattr(e, "echo", False):  # a rank repeating the main rank's error stays quiet
            print(f"pentad {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except Interrupted as e:
        if os.environ.get("RANK", "0") == "0":  # every rank stops alike; one says so
            print(f"pentad {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`pentad list zoo | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # a write that failed because of where it goes: disk full, read-only, ...
        message = write_error_message(e, _outputs(args))
        if message is None:
            raise
        print(f"pentad {args.command}: error: {message}", file=sys.stderr)
        return UserError.exit_code
