"""The commands shown in README.md and docs/*.md: each parses with the real command line, and each
config it names (a zoo recipe, or a TencentPretrain JSON in the shared data) loads with its overrides."""

from __future__ import annotations

import re
import shlex

import pytest
from tests.conftest import REPO

from pentad.cli.main import parse_arguments

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A synopsis line (alternatives, groups, placeholders such as RUN or TSV) is not an example; an example
# may show optional arguments in [brackets], tested with them.
SYNOPSIS = re.compile(r"[|(]|\.\.\.|(?<![$\w])[A-Z][A-Z_]+(?!\w)")


def _expand(text: str, variables: dict[str, str], keep: bool) -> str:
    """``$NAME`` replaced by its value (unknown names kept, or dropped as the shell would)."""
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0) if keep else ""), text)


def _examples() -> list[tuple[str, list[str]]]:
    """(where, argv) for every example command in a code block (synopsis lines are skipped)."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        variables: dict[str, str] = {}  # a file's blocks run in order: a later one reads the earlier's variables
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", line):  # NAME=VALUE, or several: A=1 B=2
                    for name, value in re.findall(r'([A-Z][A-Z0-9_]*)=("[^"]*"|\S*)', line):
                        variables[name] = _expand(value.strip('"'), variables, keep=False)
                    continue
                line = re.sub(r"^\.venv/bin/", "", line)
                line = re.split(r"\s(?:>|>>|&&|\|\|)\s", line)[0]  # the command, not its redirection
                if not line.startswith("pentad ") or SYNOPSIS.search(line.split("'")[0]):
                    continue
                line = re.sub(r"(?<=\s)\[([^\]]*)\]", r"\1", line)
                expanded = _expand(line, variables, keep=True)
                found.append((f"{path.name}: {line[:60]}", shlex.split(expanded)[1:]))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples():
    assert len(EXAMPLES) >= 15 and any(argv[0] == "finetune" for _, argv in EXAMPLES)


@pytest.mark.parametrize("where,argv", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_parses(where, argv):
    try:
        parse_arguments(argv)
    except SystemExit:
        pytest.fail(f"{where}: `pentad {' '.join(argv)}` is not accepted by the command line")


def _config_and_overrides(argv: list[str]) -> tuple[str | None, list[str]]:
    args = parse_arguments(argv)
    if args.command == "validate":
        config = args.config_option or (args.overrides[0] if args.overrides else None)
        overrides = args.overrides[0 if args.config_option else 1:]
    else:
        config, overrides = getattr(args, "config", None), list(getattr(args, "overrides", []))
    if getattr(args, "task", None) and args.command == "finetune":
        overrides.append(f"task.type={args.task}")
    return config, overrides


LOADABLE = [(w, a) for w, a in EXAMPLES if a[0] in ("validate", "preprocess", "pretrain", "finetune")]


@pytest.mark.parametrize("where,argv", LOADABLE, ids=[w for w, _ in LOADABLE])
def test_example_config_loads(where, argv, tmp_path, monkeypatch):
    from pentad.assembly import load_config
    from pentad.config.loader import zoo_names

    config, overrides = _config_and_overrides(argv)
    if config is None or (config not in zoo_names() and not (REPO / config).is_file()):
        pytest.skip(f"{config} is a placeholder or not beside the repository")
    monkeypatch.chdir(REPO)  # the documented paths are relative to the repository root
    load_config(config, overrides)
