"""The help of every ``pentad`` command: every option explained, its default shown, registry names
listed from the registry, and one spelling per option concept (the former spellings still parse).
Parsing and help only: nothing runs."""

from __future__ import annotations

import argparse
import re

import pytest

from pentad.cli.help import LISTS, Choices, Formatter, shown_default
from pentad.cli.main import build_parser, parse_arguments

# concept -> (the spelling every command uses, spellings allowed only as a further name of that option)
PREFERRED = {
    "output path": ("--output", ("--out", "--output-dir", "--out-dir", "--output_dir")),
    "batch size": ("--batch-size", ("--batch_size", "--bs")),
    "replace an existing output": ("--overwrite", ("--force", "--replace")),
    "config": ("--config", ("--cfg", "--config-file")),
    "device": ("--device", ("--devices",)),
    "seed": ("--seed", ("--random-seed",)),
    "task": ("--task", ("--task-type", "--task_type")),
}
FORMER = {old: new for new, olds in PREFERRED.values() for old in olds}
# The run a command reads is its first positional, shown as RUN; --model RUN is its former spelling.
RUN_COMMANDS = ("infer", "evaluate", "export", "merge-lora", "compress", "embed", "generate", "chat")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))
OPTIONS = [(" ".join(path), action, parser) for path, parser in PARSERS for action in parser._actions
           if not isinstance(action, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction))]


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """The help text of ``action`` as ``--help`` prints it (defaults added, registry lists filled)."""
    return " ".join(parser._get_formatter()._expand_help(action).split())


def test_the_walk_sees_every_command():
    commands = {path[0] for path, _ in PARSERS if path}
    assert {"finetune", "infer", "evaluate", "convert", "compress", "embed", "generate", "vocab"} <= commands
    assert ("vocab", "build") in {path for path, _ in PARSERS} and len(OPTIONS) > 100


@pytest.mark.parametrize("where,action,parser", OPTIONS, ids=[f"{w} {a.dest}" for w, a, _ in OPTIONS])
def test_option_is_explained_with_its_default(where, action, parser):
    assert isinstance(parser.formatter_class, type) and issubclass(parser.formatter_class, Formatter), where
    assert action.help and action.help.strip(), f"pentad {where}: {action.option_strings or action.dest} has no help"
    text = _help(action, parser)
    shown = shown_default(action)
    if shown is not None:
        assert f"(default: {shown})" in text, f"pentad {where} {action.option_strings}: {text!r}"
    assert "default: None" not in text and "(default: [])" not in text and "{" not in re.sub(r"\{[\"'\w,-]", "", text)


def test_defaults_are_shown_the_way_a_user_types_them():
    parser = argparse.ArgumentParser(formatter_class=Formatter)
    parser.add_argument("--size", type=int, nargs="+", default=[224, 160], help="size")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest difference")
    parser.add_argument("--flag", action="store_true", help="a flag")
    parser.add_argument("--maybe", help="unset")
    parser.add_argument("--percent", default="5%", help="a rate")
    text = " ".join(parser.format_help().split())
    assert "size (default: 224 160)" in text and "largest difference (default: 1e-05)" in text
    assert "a rate (default: 5%)" in text and "a flag (default" not in text and text.count("default") == 3


def test_every_task_option_names_every_registered_task():
    from pentad.cli.help import task_names

    tasks = task_names()
    assert len(tasks) >= 10 and "classification" in tasks and "ner" in tasks
    found = [(where, _help(a, p)) for where, a, p in OPTIONS if "--task" in a.option_strings]
    assert {where for where, _ in found} >= {"finetune", "infer", "evaluate"}
    for where, text in found:
        listed = re.findall(r"[a-z0-9_]+", text)
        assert set(tasks) <= set(listed), f"pentad {where} --task misses {set(tasks) - set(listed)}"


def test_a_new_task_appears_in_the_help_without_editing_the_command_line(monkeypatch):
    from pentad.cli import help as help_module

    monkeypatch.setitem(help_module.LISTS, "{tasks}", lambda: ["classification", "brand_new_task"])
    parser = dict(PARSERS)[("finetune",)]
    assert "brand_new_task" in parser.format_help()


def test_registry_lists_come_from_their_registries():
    from pentad.config.loader import zoo_names
    from pentad.interop.hf.families import family_names

    assert set(LISTS) == {"{tasks}", "{families}", "{zoo}"}
    convert = dict(PARSERS)[("convert",)]
    family = next(a for a in convert._actions if "--family" in a.option_strings)
    assert all(name in _help(family, convert) for name in family_names())
    config = next(a for a in dict(PARSERS)[("pretrain",)]._actions if "--config" in a.option_strings)
    text = _help(config, dict(PARSERS)[("pretrain",)])
    assert all(name.split("/")[0] in text for name in zoo_names())
    choices = {(w, a.dest): list(a.choices) for w, a, _ in OPTIONS if a.choices is not None}
    from typing import get_args

    from pentad.compression.quantize import KINDS as QUANTIZE
    from pentad.data.vocab_builder import KINDS as VOCAB
    from pentad.layers.pooling_kinds import PoolingKind
    from pentad.registry import ALL
    from pentad.training.grow import DEPTH_MODES

    assert choices[("embed", "pooling")] == list(get_args(PoolingKind))
    assert choices[("grow", "depth")] == list(DEPTH_MODES)
    assert choices[("compress", "quantize")] == list(QUANTIZE)
    assert choices[("vocab build", "kind")] == list(VOCAB)
    assert choices[("generate", "cache")] == ["dynamic", "static"]
    assert choices[("list", "kind")] == [*ALL, "zoo"]
    for where, action, parser in OPTIONS:  # choices read on first use are named in the help (%(choices)s)
        if isinstance(action.choices, Choices):
            assert all(name in _help(action, parser) for name in action.choices), f"pentad {where} {action.dest}"


def test_one_spelling_per_option_concept():
    for where, action, _ in OPTIONS:
        names = action.option_strings
        for i, name in enumerate(names):
            if name in FORMER:
                assert i > 0 and names[0] == FORMER[name], \
                    f"pentad {where}: {name} is the former spelling of {FORMER[name]}, not an option of its own"
                assert f"{name} is its former spelling" in action.help, f"pentad {where}: {name} is not called former"
        if action.dest in ("output", "batch_size", "overwrite", "config", "device", "seed", "task") and names:
            preferred = {"output": "--output", "batch_size": "--batch-size", "overwrite": "--overwrite",
                         "config": "--config", "device": "--device", "seed": "--seed", "task": "--task"}[action.dest]
            assert names[0] == preferred, f"pentad {where}: {names[0]} should be spelled {preferred}"
        if names and names[0] == "--output":
            assert "-o" in names, f"pentad {where}: --output without its short form -o"


def test_a_command_reading_a_run_takes_it_first_as_run():
    parsers = dict(PARSERS)
    for command in RUN_COMMANDS:
        positionals = [a for a in parsers[(command,)]._actions if not a.option_strings]
        assert positionals and str(positionals[0].metavar).split()[0] == "RUN", command
    for command in ("infer", "evaluate"):
        model = next(a for a in parsers[(command,)]._actions if "--model" in a.option_strings)
        assert "former spelling of RUN" in model.help


def test_former_spellings_still_parse_to_the_same_arguments():
    from pentad.cli.main import take_run

    new = parse_arguments(["compress", "runs/cls", "--output", "small", "--quantize", "int8"])
    old = parse_arguments(["compress", "runs/cls", "--out", "small", "--quantize", "int8"])
    assert vars(new) == vars(old) and str(new.output) == "small"
    for argv in (["infer", "runs/ft", "data.test=t.tsv", "--output", "p.tsv"],
                 ["infer", "--model", "runs/ft", "data.test=t.tsv", "--output", "p.tsv"],
                 ["infer", "data.test=t.tsv", "runs/ft", "-o", "p.tsv"]):
        args = parse_arguments(argv)
        take_run(args)
        assert str(args.model) == "runs/ft" and args.overrides == ["data.test=t.tsv"], argv
    args = parse_arguments(["evaluate", "--model", "runs/mt", "data.test.a=a.tsv", "task.num_beams=2"])
    take_run(args)
    assert str(args.model) == "runs/mt" and args.overrides == ["data.test.a=a.tsv", "task.num_beams=2"]


@pytest.mark.parametrize("argv,message", [
    (["infer", "data.test=t.tsv"], "infer needs the fine-tuned run directory first"),
    (["evaluate", "runs/a", "--model", "runs/b", "data.test=t.tsv"], "the run directory is given twice"),
    (["infer", "runs/a", "runs/b", "data.test=t.tsv"], "infer takes one run directory, found runs/a, runs/b"),
])
def test_the_run_given_wrongly_is_one_clear_error(argv, message, capsys):
    from pentad.cli.main import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_building_the_parser_and_its_help_stay_light():
    import subprocess
    import sys

    code = ("import sys; from pentad.cli.main import build_parser; p = build_parser(); "
            "p.parse_args(['embed', 'r', '--input', 'x']); assert 'torch' not in sys.modules, 'torch at build'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
