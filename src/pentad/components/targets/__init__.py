"""Targets: heads with a loss. ``forward(hidden, batch) -> TargetOutput``."""

from pentad.components.targets import bilm, cls, lm, mlm, sp  # noqa: F401
