"""pentad's progress messages: the ``pentad`` logger, written to stderr as plain lines.

Every layer reports through ``logging.getLogger(__name__)`` (a child of ``pentad``), so a library
caller can redirect or silence it with the standard ``logging`` API; the ranks of a distributed run
other than the main one are quieted with :func:`set_quiet`. The handler looks up ``sys.stderr``
when it writes, so redirected or captured stderr (tests, notebooks) receives the messages.
"""

from __future__ import annotations

import logging
import sys

ROOT = "pentad"


class _Stderr(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # pragma: no cover - as logging.StreamHandler does
            self.handleError(record)


def _root() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def get_logger(name: str = ROOT) -> logging.Logger:
    """The logger ``name`` (a module's ``__name__`` under ``pentad``), with pentad's stderr handler set up."""
    _root()
    return logging.getLogger(name)


def info(message: str) -> None:
    """A progress message on stderr (silent on the ranks of a distributed run other than the main one)."""
    _root().info(message)


def set_quiet(quiet: bool) -> None:
    """Silence progress messages in this process (warnings still show): a distributed run's other ranks."""
    _root().setLevel(logging.WARNING if quiet else logging.INFO)
