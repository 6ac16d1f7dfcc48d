"""Rewrite ``tests/slow_unit_tests.txt``, the unit tests that ``tests/conftest.py`` marks ``slow`` and
``make check`` leaves out, from the durations of a whole run of the unit tests::

    python -m pytest tests/unit -q -p no:xdist --durations=0 > durations.txt
    python tests/slow_unit_tests.py durations.txt

A test is slow when its setup, call and teardown together take ``THRESHOLD`` seconds or more.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

LIST = Path(__file__).resolve().parent / "slow_unit_tests.txt"
THRESHOLD = 1.0
_DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?:setup|call|teardown) +(?P<nodeid>tests/unit/\S.*)$")


def durations(report: str) -> Counter[str]:
    """Seconds per test id in the ``--durations=0`` section of a pytest report."""
    seconds: Counter[str] = Counter()
    for line in report.splitlines():
        match = _DURATION.match(line.rstrip())
        if match:
            seconds[match["nodeid"]] += float(match["seconds"])
    return seconds


def slow(report: str, threshold: float = THRESHOLD) -> list[str]:
    return sorted(nodeid for nodeid, s in durations(report).items() if s >= threshold)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ids = slow(Path(sys.argv[1]).read_text(encoding="utf-8"))
    if not ids:
        sys.exit(f"{sys.argv[1]}: no durations of tests/unit found (run pytest with --durations=0 and -q)")
    header = (f"# unit tests of {THRESHOLD:g} s or more (setup, call and teardown), marked slow by tests/conftest.py\n"
              "# and left out by `make check`; rewrite with tests/slow_unit_tests.py (its docstring says how)\n")
    LIST.write_text(header + "".join(f"{i}\n" for i in ids), encoding="utf-8")
    print(f"wrote {len(ids)} test ids to {LIST.name}")
