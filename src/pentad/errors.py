"""Errors that reach the user.

Every mistake a user can make (a config key, a data file, a path) raises a :class:`UserError`.
The command-line entry point prints its message and exits with status 2, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class UserError(Exception):
    """A problem with the user's input: printed as one paragraph, exit status 2."""

    exit_code = 2


class Interrupted(Exception):
    """Training stopped by a signal after saving a checkpoint; the message says how to resume.

    The exit status is the shell's convention for a process ended by that signal (128 + its
    number: 130 for SIGINT/Ctrl-C, 143 for SIGTERM), so schedulers and scripts see that the run
    did not finish, while the checkpoint makes running the same command again continue it.
    """

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config: where it is, what was expected and what was found."""

    path: str
    message: str
    source: str = ""
    received: str | None = None
    suggestion: str | None = None

    def render(self) -> str:
        where = self.path or "<root>"
        text = f"{where}: {self.message}"
        if self.received is not None:
            text += f" (received {self.received})"
        if self.suggestion:
            text += f"; did you mean '{self.suggestion}'?"
        if self.source:
            text += f" [{self.source}]"
        return text


class ConfigError(UserError):
    """One or more config problems, all reported at once."""

    def __init__(self, problems: list[ConfigProblem], header: str = "invalid config"):
        self.problems = list(problems)
        lines = [f"{header}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))


def closest(name: str, candidates) -> str | None:
    """The candidate closest to ``name`` (for "did you mean ..."), or None if nothing is close."""
    import difflib

    found = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None
