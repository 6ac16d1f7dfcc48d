"""Types: mypy over ``src/pentad`` (configured in pyproject.toml, ``[tool.mypy]``) finds no error that
``tests/mypy_baseline.txt`` does not list, and every line of the baseline still occurs: the baseline of
accepted errors only shrinks. Its lines are mypy's errors without line numbers (``path: message  [code]``),
so that an edit elsewhere in a file does not change them.

Rewrite the baseline (after a merge, or to drop fixed errors) with::

    python tests/unit/test_types.py --write-baseline
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "tests" / "mypy_baseline.txt"
REWRITE = "python tests/unit/test_types.py --write-baseline"
HEADER = (
    "# mypy's errors in src/pentad that are accepted for now, one a line, without line numbers\n"
    "# (checked by tests/unit/test_types.py). It only shrinks: delete the lines of errors you fix;\n"
    f"# rewrite it with: {REWRITE}\n"
)
#: ``path:line[:column]: severity: message`` (the line and column are absent for some errors)
_LINE = re.compile(r"^(?P<path>[^:\s][^:]*?):(?:\d+:){0,2} (?P<severity>error|warning|note): (?P<message>.*)$")
_SHOWN = 40  # the most entries one failure message lists


def normalise(output: str) -> list[str]:
    """mypy's error lines in ``output`` as baseline entries, sorted: ``path: message  [code]``, with no line
    numbers (also none inside the message: "defined on line 12" reads "defined on line N")."""
    entries = []
    for line in output.splitlines():
        match = _LINE.match(line.rstrip())
        if match and match["severity"] == "error":
            message = re.sub(r"\bline \d+\b", "line N", match["message"])
            entries.append(f"{match['path']}: {message}")
    return sorted(entries)


def compare(found: list[str], baseline: list[str]) -> tuple[list[str], list[str]]:
    """(errors that the baseline does not list, baseline entries that no longer occur), each counted: a
    baseline entry listed twice accepts the same error twice in that file."""
    new = Counter(found) - Counter(baseline)
    gone = Counter(baseline) - Counter(found)
    return sorted(new.elements()), sorted(gone.elements())


def problems(found: list[str], baseline: list[str]) -> str:
    """The failure message: empty when ``found`` is exactly the baseline."""
    new, gone = compare(found, baseline)
    parts = []
    if new:
        parts.append(f"mypy finds {len(new)} error(s) that tests/mypy_baseline.txt does not list; fix them (the "
                     "baseline only shrinks):\n" + _listing(new))
    if gone:
        parts.append(f"{len(gone)} line(s) of tests/mypy_baseline.txt no longer occur: delete them (or rewrite the "
                     f"file with `{REWRITE}`), so that the baseline only shrinks:\n" + _listing(gone))
    return "\n\n".join(parts)


def _listing(entries: list[str]) -> str:
    shown = "\n".join(f"  {e}" for e in entries[:_SHOWN])
    return shown + (f"\n  ... and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else "")


def read_baseline(path: Path = BASELINE) -> list[str]:
    """The baseline's entries (comment lines, starting with ``#``, and blank lines left out)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return sorted(line for line in lines if line.strip() and not line.startswith("#"))


def run_mypy() -> list[str]:
    """mypy over the files pyproject.toml names, with this interpreter, as baseline entries."""
    command = [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--hide-error-context",
               "--no-color-output", "--show-error-codes", "--hide-error-end", "--hide-column-numbers"]
    if importlib.util.find_spec("mypy") is None:
        raise RuntimeError("mypy is not installed in this environment: it is in the test extra "
                           "(`pip install -e \".[test]\"`, or `make install-test`)")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    entries = normalise(done.stdout)
    # 2: mypy could not run (a bad config, a crash); 1 with no error line: neither is a result to compare
    if done.returncode not in (0, 1) or (done.returncode == 1 and not entries):
        raise RuntimeError(f"mypy exited with status {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return entries


def test_normalise_drops_line_numbers_and_notes():
    output = ("src/pentad/a.py:12: error: Name \"x\" already defined on line 3  [no-redef]\n"
              "src/pentad/a.py:12:5: note: see here\n"
              "src/pentad/b.py: error: Name \"Kind\" is not defined  [name-defined]\n")
    assert normalise(output) == ['src/pentad/a.py: Name "x" already defined on line N  [no-redef]',
                                 'src/pentad/b.py: Name "Kind" is not defined  [name-defined]']


def test_new_errors_and_stale_baseline_lines_are_both_refused():
    baseline = ["src/pentad/a.py: one  [arg-type]", "src/pentad/a.py: one  [arg-type]", "src/pentad/b.py: two  [misc]"]
    assert problems(list(baseline), baseline) == ""
    assert compare(["src/pentad/a.py: one  [arg-type]"], baseline)[1] == baseline[1:]  # fixed: one of two, and b
    message = problems(baseline[1:] + ["src/pentad/c.py: three  [index]"], baseline)
    assert "1 error(s) that tests/mypy_baseline.txt does not list" in message and "c.py: three" in message
    assert "1 line(s) of tests/mypy_baseline.txt no longer occur: delete them" in message and REWRITE in message


def test_read_baseline_skips_comments(tmp_path):
    path = tmp_path / "baseline.txt"
    path.write_text(HEADER + "src/pentad/b.py: two  [misc]\n\nsrc/pentad/a.py: one  [arg-type]\n", encoding="utf-8")
    assert read_baseline(path) == ["src/pentad/a.py: one  [arg-type]", "src/pentad/b.py: two  [misc]"]


def test_mypy_finds_only_the_baseline():
    """mypy over src/pentad (cold: about a minute of one core; warm, with ``.mypy_cache``, seconds)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed in this environment: it is in the test extra "
                    "(`pip install -e \".[test]\"`, or `make install-test`)")
    message = problems(run_mypy(), read_baseline())
    assert not message, message


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-baseline"]:
        sys.exit(f"usage: {REWRITE}")
    entries = run_mypy()
    BASELINE.write_text(HEADER + "".join(f"{e}\n" for e in entries), encoding="utf-8")
    print(f"wrote {len(entries)} entries to {BASELINE.relative_to(ROOT)}")
