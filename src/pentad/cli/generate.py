"""``pentad generate``: continue prompts with a trained or converted model.

    pentad generate RUN (--prompt TEXT | --prompts FILE | --jsonl FILE | --chat FILE) [--max-new-tokens N]
        [--greedy | --sample [--temperature T] [--top-k K] [--top-p P]]
        [--num-beams N [--length-penalty X] [--early-stopping [true|false|never]]]
        [--num-return-sequences N] [--repetition-penalty X] [--seed S] [--stop TEXT ...]
        [--output FILE.jsonl] [--stream] [--device DEV] [--no-cache | --cache {dynamic,static} [--compile]]

Completions go to stdout as text, or with ``--output`` to a JSONL file (one record per completion,
with token ids, score and finish reason; ``--output -`` writes the JSONL to stdout). ``--chat FILE``
reads conversations (JSON lines ``{"messages": [...], "tools": [...]}``) and writes the assistant's next
message of each, through the tokenizer's chat template (``pentad.generation.chat``). ``--stream``
prints the tokens of a single prompt as they are produced. Mistakes (a missing run directory, an
empty prompt file, a malformed JSONL line, contradictory options) raise ``UserError`` (exit 2).

``--cache static`` pre-allocates the key/value cache at its final length (prompt + new tokens) and
writes each step in place; ``--compile`` (with ``--cache static``) runs the one-token decoding step
through ``torch.compile``, as CUDA graphs on a GPU. Both give the tokens of the default dynamic
cache; the first step of a compiled run pays for the compilation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from pentad.cli.help import Choices
from pentad.cli.paths import claim_output_file
from pentad.errors import UserError

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p")


def _caches() -> tuple[str, ...]:
    """The kinds of key/value cache (``GenerationConfig.cache``)."""
    from typing import get_args

    from pentad.generation.config import GenerationConfig

    return get_args(GenerationConfig.model_fields["cache"].annotation)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``generate`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "generate", help="generate text with a trained or converted model",
        description="Continue prompts (decoder-only models) or transform sources (encoder-decoder models) "
                    "with the model of a run directory. Greedy by default; --sample or --num-beams N for "
                    "sampling or beam search.")
    p.add_argument("run_dir", type=Path, metavar="RUN", help="run directory (trained or converted)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one prompt")
    source.add_argument("--prompts", type=Path, metavar="FILE", help="UTF-8 text file, one prompt per line")
    source.add_argument("--jsonl", type=Path, metavar="FILE",
                        help='JSON lines, each an object with a "prompt" string (other keys are copied to the '
                             'output records under "input")')
    source.add_argument("--chat", type=Path, metavar="FILE",
                        help='JSON lines, each a conversation {"messages": [{"role": ..., "content": ...}, ...]} '
                             '(optional "tools"); the reply is the assistant\'s next message, through the '
                             "tokenizer's chat template (the record goes to the output under \"input\")")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate at most")
    p.add_argument("--min-new-tokens", type=int, default=0, metavar="N", help="no stop token before N tokens")
    add_sampling_arguments(p)
    p.add_argument("--num-beams", type=int, default=1, metavar="N", help="beam search with N beams")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   metavar="X", help="beam score = log-probability / length ** X")
    p.add_argument("--early-stopping", nargs="?", const="true", default="false", choices=("true", "false", "never"),
                   help="beam search: stop a prompt once N hypotheses finished (true), when no running beam "
                        "can catch up at its length (false) or at any length (never)")
    p.add_argument("--num-return-sequences", type=int, default=1, metavar="N", help="completions per prompt")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="X",
                   help="penalise tokens already present (> 1 discourages repetition)")
    p.add_argument("--seed", type=int, help="seed for sampling (reproducible output)")
    p.add_argument("--stop", nargs="+", action="extend", default=[], metavar="TEXT",
                   help="stop a completion when it contains TEXT (not included in the output)")
    p.add_argument("--output", "-o", type=Path, metavar="FILE.jsonl", help="write JSONL records ('-': stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace the --output file if it exists")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated (one prompt)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--batch-size", type=int, default=8, metavar="N", help="prompts decoded together")
    p.add_argument("--no-cache", action="store_true", help="re-run the whole sequence each step (slow; testing)")
    p.add_argument("--cache", choices=Choices(_caches), default="dynamic", metavar="KIND",
                   help="key/value cache, one of %(choices)s: dynamic (grows as decoding goes) or static "
                        "(allocated once at prompt + --max-new-tokens positions, written in place; needed by "
                        "--compile)")
    p.add_argument("--compile", action="store_true",
                   help="compile the one-token decoding step with torch.compile (CUDA graphs on a GPU); "
                        "needs --cache static. The first step pays for the compilation")
    p.add_argument("--decoder-start", metavar="TOKEN",
                   help="encoder-decoder models: first decoder token, a role (bos, cls, pad, eos) or a token")
    return p


# ------------------------------------------------------------------------------------------ input
def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist" if not path.exists() else f"{what} {path} is not a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def read_prompts(args: argparse.Namespace) -> tuple[list[str], list[dict[str, Any] | None], list[str]]:
    """(prompts, extra JSONL fields per prompt, where each prompt came from) from the options."""
    if args.prompt is not None:
        return [args.prompt], [None], ["--prompt"]
    if getattr(args, "chat", None) is not None:
        return read_conversations(args.chat)
    if args.prompts is not None:
        text = _read_text(args.prompts, "prompt file")
        lines = text.splitlines()
        if not lines:
            raise UserError(f"prompt file {args.prompts} is empty: expected one prompt per line")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                raise UserError(f"prompt file {args.prompts}, line {number}: empty line; every line is a prompt "
                                "(remove the line, or use --jsonl for prompts that are empty or span lines)")
        return lines, [None] * len(lines), [f"{args.prompts}, line {n}" for n in range(1, len(lines) + 1)]
    path = args.jsonl
    prompts, extras, origins = [], [], []
    for number, line in enumerate(_read_text(path, "JSONL file").splitlines(), 1):
        if not line.strip():
            continue  # a blank line holds no record
        where = f"JSONL file {path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); expected an object like "
                            '{"prompt": "..."}') from None
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object with a \"prompt\" string, found "
                            f"{type(record).__name__}")
        prompt = record.get("prompt")
        if not isinstance(prompt, str):
            found = "no \"prompt\" key" if "prompt" not in record else f"a {type(prompt).__name__}"
            raise UserError(f"{where}: \"prompt\" must be a string; found {found} (keys: "
                            f"{', '.join(record) or 'none'})")
        prompts.append(prompt)
        extra = {k: v for k, v in record.items() if k != "prompt"}
        extras.append(extra or None)
        origins.append(where)
    if not prompts:
        raise UserError(f"JSONL file {path} has no records: expected one object like {{\"prompt\": \"...\"}} per line")
    return prompts, extras, origins


def read_conversations(path: Path) -> tuple[list[str], list[dict[str, Any] | None], list[str]]:
    """``--chat FILE``: (a placeholder prompt per conversation, its record, where it came from); the
    records are checked here (roles, empty assistant turns, tools), naming file, line and field."""
    from pentad.data.chat import ChatTemplateError, check_messages

    prompts, records, origins = [], [], []
    for number, line in enumerate(_read_text(path, "conversation file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"conversation file {path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); expected an object like "
                            '{"messages": [{"role": "user", "content": "..."}]}') from None
        if not isinstance(record, dict) or "messages" not in record:
            found = f"keys {', '.join(record) or 'none'}" if isinstance(record, dict) else type(record).__name__
            raise UserError(f'{where}: expected a JSON object with "messages", found {found}')
        try:
            check_messages(record["messages"])
        except ChatTemplateError as e:
            raise UserError(f"{where}: {e}") from None
        tools = record.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise UserError(f'{where}: "tools" must be a list of objects (JSON schemas of functions)')
        prompts.append("")
        records.append(record)
        origins.append(where)
    if not records:
        raise UserError(f"conversation file {path} has no records: expected one object like "
                        '{"messages": [...]} per line')
    return prompts, records, origins


# ---------------------------------------------------------------------------------------- options
def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """``--greedy`` | ``--sample`` with ``--temperature``, ``--top-k``, ``--top-p`` (``generate`` and ``chat``)."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="always take the most likely token (the default "
                      "without --sample or a sampling option)")
    mode.add_argument("--sample", action="store_true", help="sample the next token")
    p.add_argument("--temperature", type=float, help="sampling temperature (implies --sample)")
    p.add_argument("--top-k", type=int, help="sample among the K most likely tokens (implies --sample)")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass, 0 < P <= 1 (implies --sample)")


def sampling_given(args: argparse.Namespace) -> list[str]:
    """The sampling options given (names of :data:`SAMPLING_OPTIONS`); UserError when ``--greedy`` is too."""
    given = [name for name in SAMPLING_OPTIONS if getattr(args, name) is not None]
    if given and args.greedy:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise UserError(f"{flags} only apply to sampling; drop --greedy (or drop {flags})")
    return given


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """GenerationConfig fields from the command line (checked by ``build_config``)."""
    given = sampling_given(args)
    flags = ", ".join("--" + n.replace("_", "-") for n in given)
    if given and args.num_beams > 1:
        raise UserError(f"{flags} only apply to sampling, not to beam search (--num-beams {args.num_beams})")
    if args.sample and args.num_beams > 1:
        raise UserError("--sample and --num-beams > 1 cannot be combined: sampling or beam search, not both")
    if args.no_cache and args.cache == "static":
        raise UserError("--no-cache and --cache static contradict each other: --no-cache re-runs the whole "
                        "sequence every step and keeps no key/value cache to pre-allocate; drop one of them")
    if args.compile and (args.no_cache or args.cache != "static"):
        given = "--no-cache" if args.no_cache else f"--cache {args.cache}"
        raise UserError(f"--compile needs --cache static (found {given}): a compiled step reads key/value "
                        "buffers of a fixed size; add --cache static (without --no-cache), or drop --compile")
    early: bool | str = {"true": True, "false": False}.get(args.early_stopping, args.early_stopping)
    options: dict[str, Any] = dict(
        max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens,
        do_sample=bool(args.sample or given), num_beams=args.num_beams, length_penalty=args.length_penalty,
        early_stopping=early, num_return_sequences=args.num_return_sequences,
        repetition_penalty=args.repetition_penalty, seed=args.seed, use_cache=not args.no_cache,
        cache=args.cache, compile=args.compile)
    options.update({name: getattr(args, name) for name in given})
    return options


# How a root-level (cross-field) validator message of GenerationConfig spells the options on the command
# line: settings first (``name=value``), then bare field names (not ``cache`` or ``compile``, words of
# plain prose as well).
_CLI_SPELLINGS = (
    ("use_cache=true", "a key/value cache (no --no-cache)"), ("use_cache=false", "--no-cache"),
    ("cache='static'", "--cache static"), ("cache='dynamic'", "--cache dynamic"),
    ("compile=true", "--compile"), ("compile=false", "no --compile"),
    ("do_sample=false", "no --sample"), ("num_beams=1", "--num-beams 1"),
    ("do_sample", "--sample"),
    ("num_return_sequences", "--num-return-sequences"), ("num_beams", "--num-beams"),
    ("min_new_tokens", "--min-new-tokens"), ("max_new_tokens", "--max-new-tokens"),
)
_SPELLING = re.compile("|".join(r"(?<![\w\-'])" + re.escape(config) + r"(?![\w=])" for config, _ in _CLI_SPELLINGS))


def _cli_terms(message: str) -> str:
    """A GenerationConfig cross-field message (or a generation input error) with the fields named as
    command-line options."""
    table = dict(_CLI_SPELLINGS)
    return _SPELLING.sub(lambda m: table[m.group(0)], message)


def build_config(options: dict[str, Any]) -> Any:
    """A GenerationConfig; invalid values become one UserError naming the command-line options."""
    from pydantic import ValidationError

    from pentad.generation import GenerationConfig

    try:
        return GenerationConfig(**options)
    except ValidationError as e:
        problems = []
        for error in e.errors():
            field = ".".join(str(x) for x in error["loc"])
            flag = f"--{field.replace('_', '-')}: " if field else ""
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{flag}{message} (received {error.get('input')!r})" if field else _cli_terms(message))
        raise UserError("invalid generation options: " + "; ".join(problems)) from None


def _device(name: str) -> Any:
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device name (cpu, cuda, cuda:1, mps, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return device


# ---------------------------------------------------------------------------------------- running
def _record(index: int, prompt: str, sequence: int, completion: Any, extra: dict[str, Any] | None) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "prompt": prompt, "sequence": sequence, "text": completion.text,
                              "tokens": completion.token_ids, "num_tokens": len(completion.token_ids),
                              "score": round(completion.score, 6), "finish_reason": completion.finish_reason}
    if extra:
        record["input"] = extra
    return record


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    from pentad.files import atomic_write_text

    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write_text(path, text)
    print(f"wrote {len(records)} completion(s) to {path}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run ``pentad generate``; returns the exit status (UserError propagates to the entry point)."""
    prompts, extras, origins = read_prompts(args)
    config = build_config(generation_options(args))
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.stream and (len(prompts) != 1 or config.strategy == "beam" or config.num_return_sequences != 1):
        raise UserError("--stream shows one completion as it grows: give a single prompt, without --num-beams "
                        "or --num-return-sequences")
    claim: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if args.output is not None and str(args.output) != "-":  # checked before the model is loaded and run
        claim = claim_output_file(args.output, args.overwrite, "--output", [
            ("run directory", args.run_dir), ("--prompts", getattr(args, "prompts", None)),
            ("--jsonl", getattr(args, "jsonl", None)), ("--chat", getattr(args, "chat", None))], "pentad generate")
    with claim:
        return _generate(args, prompts, extras, origins, config)


def _generate(args: argparse.Namespace, prompts: list[str], extras: list[Any], origins: list[str], config: Any) -> int:
    from pentad.generation import TextGenerator
    from pentad.generation.config import GenerationInputError

    device = _device(args.device)
    generator = TextGenerator.from_run(args.run_dir, device, decoder_start=args.decoder_start)
    if getattr(args, "chat", None) is not None:  # the chat template's prompts, checked to fit
        from pentad.generation import chat

        chat.check_chat_model(generator, str(args.run_dir))
        resolved = generator.config(config)
        ids = []
        for index, (record, origin) in enumerate(zip(extras, origins)):
            ids.append(chat.prompt_ids(generator, record["messages"], record.get("tools")))
            prompts[index] = generator.tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True,
                                                                     tools=record.get("tools"), tokenize=False)
            try:
                chat.check_length(generator, ids[-1], resolved, f'{origin}, "messages"')
            except GenerationInputError as e:
                raise UserError(_cli_terms(str(e))) from None
    else:
        ids = [generator.encode(prompt) for prompt in prompts]
    for prompt_ids, origin in zip(ids, origins):
        if not prompt_ids:
            raise UserError(f"{origin}: the prompt encodes to no tokens, and this model needs at least one "
                            "(it adds no start token); give a non-empty prompt")
    try:
        if args.stream:
            def show(piece: str) -> None:
                sys.stdout.write(piece)
                sys.stdout.flush()

            completion = generator.stream_ids(ids[0], show, config, stop_strings=args.stop)
            sys.stdout.write("\n")
            sys.stdout.flush()
            results = [[completion]]
        else:
            results = generator.generate_ids(ids, config, stop_strings=args.stop, batch_size=args.batch_size)
    except GenerationInputError as e:  # options the model cannot serve, named as on the command line
        raise UserError(_cli_terms(str(e))) from None
    if args.output is not None:
        records = [_record(i, prompts[i], j, c, extras[i]) for i, group in enumerate(results)
                   for j, c in enumerate(group)]
        _write_jsonl(args.output, records)
    elif not args.stream:
        single = len(results) == 1 and len(results[0]) == 1
        for i, group in enumerate(results):
            for j, completion in enumerate(group):
                if not single:
                    kind = "conversation" if getattr(args, "chat", None) else "prompt"
                    print(f"### {kind} {i + 1}" + (f", sequence {j + 1}" if len(group) > 1 else ""))
                print(completion.text, flush=True)
    return 0
