"""``reuse``: attention-weight reuse with stochastic recomputation (the ``attention_reuse`` section): every
layer not a multiple of ``every`` may reuse the previous layer's probabilities (without query/key
projections when they are never used); the others are plain self-attention."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pentad.components.attention import attention_sizes
from pentad.config.base import StrictModel
from pentad.layers.attention import AttentionReuse, ReusingAttention, SelfAttention, ValueReuseAttention
from pentad.layers.transformer import BlockFactory
from pentad.registry import ATTENTION_BLOCKS


class AttentionReuseConfig(StrictModel):
    """``model.encoder.attention_reuse`` / ``model.decoder.attention_reuse``: attention-weight reuse
    with stochastic recomputation (self-attention only; see ``layers/attention.py``)."""

    every: int = Field(2, ge=2, description="layers 0, every, 2*every, ... compute their attention; each of the "
                       "others reuses the previous layer's attention probabilities (per head) and applies only its "
                       "own value and output projections")
    recompute_p: float = Field(0.0, ge=0.0, le=1.0, description="while training, the probability that a reusing "
                               "layer recomputes its own attention instead (drawn per layer at every training "
                               "forward, the same on every rank); 1: the plain model")
    eval: Literal["reuse", "recompute"] = Field("reuse", description="what a reusing layer does in eval mode "
                                                "(evaluation, inference, generation)")
    keep_qk: bool | None = Field(None, description="keep the reusing layers' query/key projections; default: "
                                 "kept when they are ever used (recompute_p > 0 or eval: recompute); false: "
                                 "pure reuse, those layers have a value projection v alone")
    seed: int = Field(0, ge=0, description="seed of the recomputation draws (independent of the ranks' random "
                      "states)")

    def keeps_qk(self) -> bool:
        return self.keep_qk if self.keep_qk is not None else self.recompute_p > 0 or self.eval == "recompute"

    def reuses(self, index: int) -> bool:
        """Whether layer ``index`` is a reusing layer."""
        return index % self.every != 0

    def runtime(self) -> AttentionReuse:
        """The stack's recomputation plan."""
        return AttentionReuse(self.recompute_p, self.eval == "recompute", self.seed)


@ATTENTION_BLOCKS.register("reuse")
class ReuseAttentionBlock:
    @staticmethod
    def applies(cfg: Any) -> bool:
        return cfg.attention_reuse is not None

    @staticmethod
    def factory(cfg: Any, model: Any) -> BlockFactory:
        sizes = attention_sizes(cfg, model)
        reuse: AttentionReuseConfig = cfg.attention_reuse

        def make(index: int) -> SelfAttention | ValueReuseAttention:
            if not reuse.reuses(index):
                return SelfAttention(**sizes)
            return ReusingAttention(**sizes) if reuse.keeps_qk() else ValueReuseAttention(**sizes)

        return make
