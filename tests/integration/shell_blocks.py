"""Running documented ```bash blocks as a user would: the scratch layout that stands for the repository root
(``.venv/bin`` this interpreter's, ``../shared`` the shared data), the environment (``QUICK=1``, one thread,
loopback, a free torchrun port) and the ``runs/...`` paths a block names. README.md's blocks
(test_readme_commands.py) and each doc's main example (test_doc_examples.py) run through it."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

from tests.conftest import REPO, SHARED


def named_runs(block: str) -> list[str]:
    """The ``runs/...`` paths a block names (shell variables and quotes trimmed)."""
    return sorted({m.rstrip(".,;:)'\"") for m in re.findall(r"(?<![\w/$.])runs/[\w./-]+", block)})


def scratch_root(parent: Path) -> Path:
    """``parent/repo``, standing for the repository root: ``.venv`` is this interpreter's virtual
    environment (or ``.venv/bin`` its directory) and ``../shared`` the shared data beside the repository."""
    (parent / "shared").symlink_to(SHARED.parent, target_is_directory=True)
    root = parent / "repo"
    root.mkdir()
    if sys.prefix != sys.base_prefix:  # a virtual environment: all of it, so .venv/bin/python finds its pyvenv.cfg
        (root / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    else:
        (root / ".venv").mkdir()
        (root / ".venv" / "bin").symlink_to(os.path.dirname(sys.executable), target_is_directory=True)
    return root


def free_port() -> int:
    """torchrun's port (PET_MASTER_PORT), free now: its default may be taken by another launch on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block_env() -> dict[str, str]:
    """The environment a block runs in: QUICK=1, one thread, gloo on loopback, this checkout's sources."""
    env = {**os.environ, "QUICK": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1", "PET_MASTER_PORT": str(free_port())}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env
