"""Each doc's main example executed end to end with ``QUICK=1``: the ```bash block directly below a line
``<!-- main example -->`` in docs/*.md.

The docs are the source: the blocks are read from them, not copied here. A main example runs from the
repository root with ``.venv/bin/pentad``, makes its own inputs under ``runs/`` (``pentad data prepare``,
or ``../shared/data`` where the README reads it too) and shrinks itself with
``[ -z "${QUICK:-}" ] || NAME=...`` to a minute or so on 2 cores. It runs as README.md's blocks do
(tests/integration/shell_blocks.py): bash under ``set -euo pipefail`` in a scratch layout of its own, and
afterwards every ``runs/...`` path it names exists. The fast test checks the convention itself: every doc
of :data:`MAIN_EXAMPLES` has exactly one main example, which calls ``.venv/bin/`` commands and which
``QUICK`` shrinks.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from tests.conftest import REPO, SHARED
from tests.integration.shell_blocks import block_env, named_runs, scratch_root

DOCS = REPO / "docs"
MARKER = "<!-- main example -->"
# the docs that must have a main example
MAIN_EXAMPLES = ["compress.md", "config.md", "conversion.md", "data.md", "distributed.md", "generation.md",
                 "moe.md", "speech.md", "streams.md", "tasks.md", "tencentpretrain_import.md", "training.md",
                 "vision.md", "zoo.md"]
# docs whose main example runs a program that is not a Python package: (program, how to install it)
NEEDS_PROGRAM = {"speech.md": ("espeak-ng", "apt-get install -y --no-install-recommends espeak-ng")}
QUICK_LINE = re.compile(r'^\[ -z "\$\{QUICK:-\}" \] \|\| (.+)$', re.M)


def main_examples(text: str) -> list[str | None]:
    """The block below each marker line of a doc (None where the marker has no ```bash block right below)."""
    lines = text.splitlines(keepends=True)
    found: list[str | None] = []
    for i, line in enumerate(lines):
        if line.strip() == MARKER:
            rest = "".join(lines[i + 1:])
            m = re.match(r"```bash\n(.*?)^```", rest, re.S | re.M)
            found.append(m.group(1) if m else None)
    return found


def _example(name: str) -> str:
    [block] = main_examples((DOCS / name).read_text(encoding="utf-8"))
    assert block is not None
    return block


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


MARKED = sorted(p.name for p in DOCS.glob("*.md") if MARKER in p.read_text(encoding="utf-8"))


def test_the_lists_name_docs():
    assert all((DOCS / name).is_file() for name in MAIN_EXAMPLES)
    unlisted = sorted(set(MARKED) - set(MAIN_EXAMPLES))
    assert not unlisted, f"{unlisted} have a main example: add them to MAIN_EXAMPLES"


@pytest.mark.parametrize("name", MAIN_EXAMPLES)
def test_a_doc_has_one_quick_main_example(name):
    text = (DOCS / name).read_text(encoding="utf-8")
    blocks = main_examples(text)
    assert len(blocks) == 1, f"{name}: {len(blocks)} lines '{MARKER}', expected one"
    [block] = blocks
    assert block is not None, f"{name}: '{MARKER}' is not directly above a ```bash block"
    assert ".venv/bin/pentad " in block, f"{name}: its main example runs no .venv/bin/pentad command"
    bare = re.findall(r"(?:^\s*|[;&|(]\s*)((?:pentad|python|torchrun|deepspeed) )", block, re.M)
    assert not bare, f"{name}: a command without .venv/bin/: {bare}"
    quick = QUICK_LINE.findall(block)
    assert quick, f'{name}: no line `[ -z "${{QUICK:-}}" ] || NAME=...` shrinks its main example'
    shrunk = re.findall(r"([A-Z][A-Z0-9_]*)=", " ".join(quick))
    assert shrunk, f"{name}: its QUICK line sets no variable"
    after = block[block.index(quick[-1]) + len(quick[-1]):]
    unused = [v for v in shrunk if not re.search(rf"\$\{{?{v}\b", after)]
    assert not unused, f"{name}: QUICK sets {unused}, which no command after it reads"


@pytest.mark.heavy
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.distributed] if "torchrun" in _text(n) else [])
                                  for n in MARKED])
def test_main_example_runs(name, tmp_path):
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    if name in NEEDS_PROGRAM and shutil.which(NEEDS_PROGRAM[name][0]) is None:
        program, install = NEEDS_PROGRAM[name]
        pytest.skip(f"{name}'s main example runs {program}, which is not on PATH ({install})")
    root = scratch_root(tmp_path)
    block = _example(name)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{block}"], cwd=root, env=block_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{name}'s main example failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    missing = [p for p in named_runs(block) if not (root / p).exists()]
    assert not missing, f"{name}'s main example names {missing}, which it did not make"
