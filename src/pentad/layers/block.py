"""The contract of the blocks a transformer layer is assembled from (attention, feed-forward).

A block is a plain ``nn.Module`` that

* initialises its own parameters: ``reset_parameters(std, scheme)`` with ``scheme`` ``normal``
  (N(0, std) weights, zero biases: BERT, GPT-2) or ``t5`` (fan-in-scaled, Mesh TensorFlow), so
  the builder never needs to know a block's internal layout (fused ``qkv`` rows, stacked experts);
* declares what its ``forward`` reads beyond the hidden states (``routed``: the feed-forward
  takes ``padding_mask`` and ``router_input``, as a mixture of experts does);
* declares whether it runs for the first n positions' queries alone (``leading_queries``: a
  self-attention that :class:`~pentad.layers.attention.LeadingQueries` can view, as the last layer of a
  stack whose heads read only those positions does);
* reports auxiliary losses and metrics of its last forward through ``pop_aux`` (``has_aux``):
  MoE load balancing and router z-loss, which the model output carries beside the targets';
* names its projections by role where it has plain ones (``roles()``: projection attribute ->
  {role: (first row, end row)}; attention's ``q``/``k``/``v``/``o``, a feed-forward's
  ``gate``/``up``/``down``), which is all that adapts (LoRA) or cuts (pruning) them from outside reads.

Blocks build their projections as plain ``nn.Linear``; what replaces or wraps one from outside
(LoRA, int8 quantisation) and changes how its output is computed says how to compute some of its
output rows (:class:`RowProjection`), so a block that needs only some rows (:func:`output_rows`)
never asks what kind of projection it holds.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol, runtime_checkable

import torch.nn.functional as F
from torch import Tensor, nn

InitScheme = Literal["normal", "t5"]


class Block(nn.Module):
    """Base of transformer-layer blocks (see the module docstring)."""

    routed: ClassVar[bool] = False
    leading_queries: ClassVar[bool] = False
    has_aux: ClassVar[bool] = False

    def reset_parameters(self, std: float = 0.02, scheme: InitScheme = "normal") -> None:  # pragma: no cover
        raise NotImplementedError

    def pop_aux(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(auxiliary losses, metrics) of the last forward, each name -> scalar, already weighted;
        cleared by the call so that no graph outlives its step."""
        return {}, {}


def init_linear(linear: nn.Linear | None, std: float) -> None:
    """N(0, std) weight, zero bias."""
    if linear is None:
        return
    nn.init.normal_(linear.weight, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


@runtime_checkable
class RowProjection(Protocol):
    """A module that stands in for an ``nn.Linear`` and computes output rows its own way."""

    def rows(self, x: Tensor, start: int, end: int) -> Tensor:
        """Output rows ``start:end`` of this projection of ``x`` [..., in]: [..., end - start]."""
        ...  # pragma: no cover


def output_rows(linear: nn.Module, x: Tensor, start: int, end: int) -> Tensor:
    """Output rows ``start:end`` of ``linear(x)``: a :class:`RowProjection` computes them itself; a
    linear layer's own ``weight`` and ``bias`` rows are applied alone (the other rows cost nothing)."""
    if isinstance(linear, RowProjection):
        return linear.rows(x, start, end)
    bias = linear.bias[start:end] if linear.bias is not None else None
    return F.linear(x, linear.weight[start:end], bias)
