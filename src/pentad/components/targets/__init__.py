"""Targets: heads with a loss. ``forward(hidden, batch) -> TargetOutput``."""

from pentad.components.targets import bilm, clr, cls, cosine, lm, mlm, pair_cls, sp, span, tagger  # noqa: F401
