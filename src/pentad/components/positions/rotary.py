"""``positions: rotary``: rotary embeddings (RoPE, Su et al. 2021) of ``rotary_dim`` dimensions per
head (default all; latent attention's ``qk_rope_head_dim``), base ``rotary_base``, scaled by the
``rope_scaling`` section when it is set (``components/positions/rope_scaling.py``); the local
(sliding-window) layers at ``rotary_local_base`` unscaled when it is set."""

from __future__ import annotations

from typing import Any

from pentad.layers.positions import Rotary
from pentad.registry import POSITION_SCHEMES


@POSITION_SCHEMES.register("rotary")
class RotaryPositions:
    @staticmethod
    def build(cfg: Any, model: Any, mask: str) -> Rotary:
        scaling = cfg.rope_scaling.resolved(model.max_seq_length) if cfg.rope_scaling is not None else None
        return Rotary(cfg.rotary_width(model.hidden_size), cfg.rotary_base, scaling, cfg.rotary_local_base)
