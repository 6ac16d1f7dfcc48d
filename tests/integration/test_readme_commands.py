"""README.md's ```bash blocks executed end to end, in order, with ``QUICK=1`` (a few steps on a few rows).

The README is the source: the blocks are read from it, not copied here. They run with bash under
``set -euo pipefail`` in a scratch layout like the README's (a directory standing for the repository
root, with ``../shared`` the shared data and ``.venv/bin`` this interpreter's), each block after the
ones before it, its shell variables carried on. After a block, every ``runs/...`` path it names exists
(its inputs were made before it, its outputs by it). The first block (``make demo``, ``make test``) is
the set-up, which this environment stands for (the quick demo has its own test; ``make test`` would run
this suite). tests/integration/test_docs_commands.py checks that each command parses.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from tests.conftest import REPO, SHARED
from tests.integration.shell_blocks import block_env, named_runs, scratch_root

README = REPO / "README.md"
BLOCKS = [b for b in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
          if not all(line.startswith("make ") for line in b.strip().splitlines())]
VARIABLES = sorted({name for b in BLOCKS for name in re.findall(r"(?:^|[\s;|])([A-Z][A-Z0-9_]*)=", b)})


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    return scratch_root(tmp_path_factory.mktemp("readme"))


def _run_block(root, index: int) -> None:
    state = root / "variables.sh"
    state.touch()
    script = (f"set -euo pipefail\nsource {state}\n{BLOCKS[index]}\n"
              f"{{ declare -p {' '.join(VARIABLES)} 2>/dev/null || true; }} > {state}\n")
    proc = subprocess.run(["bash", "-c", script], cwd=root, env=block_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (f"README block {index + 1} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    missing = [p for p in named_runs(BLOCKS[index]) if not (root / p).exists()]
    assert not missing, f"README block {index + 1} names {missing}, which it did not make"


DISTRIBUTED = [i for i, b in enumerate(BLOCKS) if "torchrun" in b or "deepspeed " in b]


def test_the_readme_has_runnable_blocks():
    assert len(BLOCKS) >= 4 and DISTRIBUTED == [len(BLOCKS) - 1]
    assert "QUICK" in BLOCKS[0] and all(".venv/bin/pentad" in b for b in BLOCKS)
    assert not re.search(r"^\s*pentad ", "\n".join(BLOCKS), re.M), "a command without .venv/bin/"


@pytest.mark.heavy
def test_readme_commands_run(layout):
    """Every block but the distributed one, in order: the produced files are there and sound."""
    for index in range(len(BLOCKS)):
        if index not in DISTRIBUTED:
            _run_block(layout, index)
    predictions = (layout / "runs/predictions.tsv").read_text(encoding="utf-8").splitlines()
    assert predictions[0].split("\t") == ["label", "prob_0", "prob_1"] and len(predictions) == 1 + 8
    assert (layout / "runs/cmrc/predictions.json").is_file()
    outputs = (layout / "runs/out.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(outputs) == len((layout / "runs/prompts.txt").read_text(encoding="utf-8").splitlines())
    assert (layout / "runs/hf-gpt2/config.json").is_file()


@pytest.mark.heavy
@pytest.mark.distributed
def test_readme_distributed_commands_run(layout):
    """The torchrun and DeepSpeed block (after the blocks it reads from: the quickstart's dataset)."""
    pytest.importorskip("deepspeed", reason="the README's DeepSpeed command needs pentad[deepspeed]")
    if not (layout / "runs/book_review_ds").is_dir():
        _run_block(layout, 0)
    for index in DISTRIBUTED:
        _run_block(layout, index)
    assert (layout / "runs/pt3_whole/model.safetensors").is_file()
