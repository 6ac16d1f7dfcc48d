"""``pentad chat``: talk with a chat model in the terminal.

    pentad chat RUN [--system TEXT] [--max-new-tokens N] [--greedy | --sample [--temperature T]
        [--top-k K] [--top-p P]] [--seed S] [--repetition-penalty X] [--stop TEXT ...] [--device DEV]

Reads the user's messages from stdin, one line each, and prints each reply on stdout as it is
generated (one line after it). The conversation so far is the prompt of every turn, through the run
tokenizer's chat template (``pentad.generation.chat``). ``/reset`` starts a new conversation, ``/exit``
(or the end of the input) ends the session. A turn that no longer fits in the model's positions is
reported on stderr and left out of the history.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pentad.cli.generate import add_sampling_arguments, sampling_given

COMMANDS = ("/reset", "/exit")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``chat`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "chat", help="chat with a model in the terminal (its tokenizer's chat template)",
        description="An interactive chat on stdin/stdout with the model of a run directory: each line is a user "
                    "message, each reply streams as it is generated. /reset clears the history, /exit ends.")
    p.add_argument("run_dir", type=Path, metavar="RUN", help="run directory (trained or converted)")
    p.add_argument("--system", metavar="TEXT", help="a system message that starts every conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="tokens per reply at most")
    add_sampling_arguments(p)
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="X",
                   help="penalise tokens already present (> 1 discourages repetition)")
    p.add_argument("--seed", type=int, help="seed for sampling (the whole session replays)")
    p.add_argument("--stop", nargs="+", action="extend", default=[], metavar="TEXT",
                   help="end a reply when it contains TEXT (not included)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    return p


def options(args: argparse.Namespace) -> dict[str, Any]:
    """GenerationConfig fields from the command line."""
    sampling = sampling_given(args)
    fields: dict[str, Any] = dict(max_new_tokens=args.max_new_tokens, do_sample=bool(args.sample or sampling),
                                  repetition_penalty=args.repetition_penalty, seed=args.seed)
    fields.update({name: getattr(args, name) for name in sampling})
    return fields


def run(args: argparse.Namespace) -> int:
    """Run ``pentad chat``; returns the exit status."""
    from pentad.cli.generate import _device, build_config
    from pentad.generation import TextGenerator
    from pentad.generation.chat import ChatSession, ConversationTooLong

    config = build_config(options(args))
    generator = TextGenerator.from_run(args.run_dir, _device(args.device))
    session = ChatSession(generator, config, system=args.system, stop_strings=args.stop, label=str(args.run_dir))
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {args.run_dir} ({' '.join(COMMANDS)}; Ctrl-D ends)", file=sys.stderr)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    while True:
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\r\n")
        command = text.strip()
        if command == "/exit":
            break
        if command == "/reset":
            session.reset()
            print("(new conversation)", file=sys.stderr, flush=True)
            continue
        if not command:
            continue
        if command.startswith("/") and " " not in command:
            print(f"unknown command {command}; the commands are {', '.join(COMMANDS)} (anything else is a "
                  "message)", file=sys.stderr, flush=True)
            continue
        try:
            session.send(text, show)
        except ConversationTooLong as e:
            print(f"pentad chat: {e}; /reset starts a new conversation", file=sys.stderr, flush=True)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0
