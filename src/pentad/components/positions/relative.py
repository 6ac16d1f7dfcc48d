"""``positions: relative``: T5's bucketed relative position bias (``relative_buckets``,
``relative_max_distance``), one table per stack, bidirectional in a bidirectional encoder."""

from __future__ import annotations

from typing import Any

from pentad.layers.positions import RelativePositionBias
from pentad.registry import POSITION_SCHEMES


@POSITION_SCHEMES.register("relative")
class RelativePositions:
    @staticmethod
    def build(cfg: Any, model: Any, mask: str) -> RelativePositionBias:
        return RelativePositionBias(cfg.num_heads, cfg.relative_buckets, cfg.relative_max_distance,
                                    bidirectional=mask == "bidirectional")
