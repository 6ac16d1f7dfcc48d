"""Contrastive target over the two pooled streams of a two-stream model (CLIP, SimCSE, in-batch
negatives for sentence embeddings).

Row i of stream 0 and row i of stream 1 are a positive pair; every other row of the batch is a
negative (InfoNCE, van den Oord et al. 2018). Each stream's vector is optionally projected to
``feature_size`` (a linear map without bias, one per stream: CLIP, Radford et al. 2021), L2
normalised, and the cosine similarities are scaled by a learnable ``exp(logit_scale)`` initialised
to 1/0.07 and capped at 100 (CLIP), or divided by a fixed ``temperature`` (SimCSE uses 0.05, Gao
et al. 2021). The loss is the mean of the cross-entropies of stream 0 -> stream 1 and stream 1 ->
stream 0 (symmetric, CLIP), or of the first only. No labels are needed.

Hard negatives (``PooledPair.negative``, from ``Batch.negative``: supervised SimCSE's
contradictions, Gao et al. 2021, eq. 5) join stream 1's candidates: each stream 0 row is scored
against the N stream 1 rows and the N negatives ([N, 2N] logits). In the symmetric direction the
negatives are not queries: stream 1 rows are scored against stream 0 rows only.

Under data parallelism the other ranks' vectors join the negatives (as TencentPretrain's
``ClrTarget`` and SimCSE do): they are gathered without gradient, the local rows keep theirs, and
every rank computes the loss of the whole gathered batch, so that the gradients averaged over
ranks are those of the global batch. This needs the same batch size on every rank. In eval mode
nothing is gathered (no gradient needs the other ranks' rows; every rank scores its own rows), so
``logits`` are this batch's rows against this batch's rows and ``logits[i, i] / scale`` is the
cosine similarity of pair i.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from pentad.components.base import Batch, PooledPair, Target, TargetOutput
from pentad.components.stream import pair_widths
from pentad.components.targets.common import TargetConfigBase
from pentad.layers.soft_labels import SoftLoss
from pentad.registry import TARGETS


class ClrTargetConfig(TargetConfigBase):
    type: Literal["clr"] = "clr"
    projection: bool = Field(False, description="project each stream to feature_size (a linear map per "
                             "stream, no bias) before normalising (CLIP)")
    feature_size: int | None = Field(None, ge=1, description="width of the projected features; default: "
                                     "stream 0's width")
    temperature: float | None = Field(None, gt=0.0, description="fixed softmax temperature (SimCSE: 0.05); "
                                      "default: a learnable logit scale (CLIP)")
    init_temperature: float = Field(0.07, gt=0.0, description="initial temperature of the learnable scale")
    max_logit_scale: float = Field(100.0, gt=0.0, description="cap on exp(logit_scale) (CLIP: 100)")
    symmetric: bool = Field(True, description="average the losses of both directions (CLIP); false: "
                            "stream 0 -> stream 1 only (SimCSE)")
    gather: bool = Field(True, description="with data parallelism, use the other ranks' rows as negatives")

    def check(self, model) -> list[tuple[str, str]]:
        problems = []
        widths = pair_widths(model, self)
        if not self.projection and widths[0] != widths[1]:
            problems.append(("projection", f"the streams are {widths[0]} and {widths[1]} wide, so they can only "
                                           "be compared after projection: set projection: true (and feature_size)"))
        if self.feature_size is not None and not self.projection:
            problems.append(("feature_size", "set, but projection is false (feature_size is the projected width)"))
        # (a saved run's config spells out every default, so only a changed value is a mistake)
        default_init = type(self).model_fields["init_temperature"].default
        if self.temperature is not None and self.init_temperature != default_init:
            problems.append(("init_temperature", "set, but temperature fixes the scale (nothing is learned)"))
        return problems


@TARGETS.register("clr")
class ClrTarget(Target):
    """PooledPair (first [B,H0], second [B,H1], optional negative [B,H1]) -> InfoNCE loss; logits
    [B, N] or [B, 2N] with hard negatives (scaled similarities of this rank's stream 0 rows to all N
    stream 1 rows, then to the N negatives; N = B without parallelism and in eval mode).
    Metrics: ``correct`` (rows whose positive scores highest, both directions counted) and ``count``."""

    Config = ClrTargetConfig
    reads_pair = True

    def __init__(self, name: str, widths: tuple[int, int], projection: bool = False,
                 feature_size: int | None = None, temperature: float | None = None,
                 init_temperature: float = 0.07, max_logit_scale: float = 100.0, symmetric: bool = True,
                 gather: bool = True):
        super().__init__(name)
        if not projection and widths[0] != widths[1]:
            raise ValueError(f"streams of widths {widths} need projection")
        size = feature_size or widths[0]
        self.projection_0 = nn.Linear(widths[0], size, bias=False) if projection else None
        self.projection_1 = nn.Linear(widths[1], size, bias=False) if projection else None
        self.temperature = temperature
        # log(1/0.07) as CLIP; a fixed temperature has no parameter at all.
        self.logit_scale = (nn.Parameter(torch.full((), math.log(1.0 / init_temperature)))
                            if temperature is None else None)
        self.max_log_scale = math.log(max_logit_scale)
        self.symmetric = symmetric
        self.gather = gather

    @classmethod
    def from_config(cls, cfg: ClrTargetConfig, model) -> ClrTarget:
        return cls(cfg.target_name, pair_widths(model, cfg), cfg.projection, cfg.feature_size, cfg.temperature,
                   cfg.init_temperature, cfg.max_logit_scale, cfg.symmetric, cfg.gather)

    def required_fields(self, training: bool = True) -> tuple[str, ...]:
        return tuple(self.requires)  # in-batch pairs: no labels

    def scale(self) -> Tensor:
        """The factor on cosine similarities: exp(logit_scale) capped, or 1 / temperature."""
        if self.logit_scale is None:
            return torch.tensor(1.0 / float(self.temperature or 1.0))
        return self.logit_scale.clamp(max=self.max_log_scale).exp()

    def features(self, pooled: PooledPair) -> tuple[Tensor, Tensor]:
        """The L2-normalised (projected) vectors of both streams, [B,F] each, in float32."""
        return self.stream_features(pooled.first, 0), self.stream_features(pooled.second, 1)

    def stream_features(self, pooled: Tensor, stream: int) -> Tensor:
        """One stream's pooled vectors [B,H] -> L2-normalised (projected) features [B,F], float32: what
        retrieval and zero-shot classification compare across a whole set."""
        projection = self.projection_0 if stream == 0 else self.projection_1
        if projection is not None:
            pooled = projection(pooled)
        return F.normalize(pooled.float(), dim=-1)

    def negative_features(self, pooled: PooledPair) -> Tensor | None:
        """The hard negatives' vectors [B,F] (stream 1's projection), or None."""
        if pooled.negative is None:
            return None
        c = pooled.negative if self.projection_1 is None else self.projection_1(pooled.negative)
        return F.normalize(c.float(), dim=-1)

    def forward(self, hidden: PooledPair, batch: Batch) -> TargetOutput:  # type: ignore[override]
        a, b = self.features(hidden)
        c = self.negative_features(hidden)
        rows = a.shape[0]
        gather = self.gather and self.training
        a, offset = _gathered(a) if gather else (a, 0)
        b, _ = _gathered(b) if gather else (b, 0)
        if c is not None:
            c, _ = _gathered(c) if gather else (c, 0)
        n = a.shape[0]
        scale = self.scale().to(a.device)
        candidates = b if c is None else torch.cat([b, c])
        logits = scale * a @ candidates.T  # [N, N] or [N, 2N]: stream 0 rows against stream 1 rows (+ negatives)
        labels = torch.arange(n, device=a.device)
        loss = F.cross_entropy(logits, labels)
        local = slice(offset, offset + rows)  # metrics count this rank's rows only
        with torch.no_grad():
            correct = (logits[local].argmax(dim=-1) == labels[local]).sum()
        count = rows
        if self.symmetric:
            logits_back = logits[:, :n].T  # stream 1 rows against stream 0 rows
            loss = (loss + F.cross_entropy(logits_back, labels)) / 2
            with torch.no_grad():
                correct = correct + (logits_back[local].argmax(dim=-1) == labels[local]).sum()
            count *= 2
        metrics = {"correct": correct, "count": torch.tensor(count, device=a.device)}
        return TargetOutput(loss=loss, metrics=metrics, logits=logits[local])

    def distill_loss(self, student: TargetOutput, teacher: TargetOutput | None, batch: Batch, temperature: float,
                     kind: SoftLoss) -> Tensor | None:
        """None: the logits score a batch against itself (and, while training with data parallelism,
        against the other ranks' rows, which a teacher in eval mode does not gather); they are not class
        scores a teacher could soften."""
        return None


def _gathered(x: Tensor) -> tuple[Tensor, int]:
    """(rows of every rank [N,F] with the local rows keeping their gradient, offset of the local
    rows); ``x`` itself and 0 without data parallelism."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach().contiguous())
    # The local rows are the only ones this rank sends gradient through, and data parallelism
    # averages the ranks' gradients: scaling the local rows' gradient (not their value) by the
    # world size makes that average the gradient of the global-batch loss. Parameters applied
    # after the gather (the logit scale) see the whole loss on every rank and need no scaling.
    parts[rank] = world * x - (world - 1) * x.detach()
    return torch.cat(parts), rank * x.shape[0]
