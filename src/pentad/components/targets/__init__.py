"""Targets: heads with a loss. ``forward(hidden, batch) -> TargetOutput``."""

from pentad.components.targets import (  # noqa: F401
    bilm,
    choice,
    clr,
    cls,
    cosine,
    lm,
    mlm,
    multi_label,
    pair_cls,
    prompt,
    regression,
    sp,
    span,
    tagger,
)
