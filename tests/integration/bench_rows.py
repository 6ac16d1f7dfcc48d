"""The data derivations of ``bench/downstream_tasks/`` rows, for tests that fine-tune on the same data."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROWS = Path(__file__).resolve().parents[2] / "bench" / "downstream_tasks"


def bench_row(name: str) -> ModuleType:
    """The module ``bench/downstream_tasks/<name>.py``, loaded from its file (bench is not a package on the
    tests' path)."""
    spec = importlib.util.spec_from_file_location(f"bench_row_{name}", ROWS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
