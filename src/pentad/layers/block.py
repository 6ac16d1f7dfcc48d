"""The contract of the blocks a transformer layer is assembled from (attention, feed-forward).

A block is a plain ``nn.Module`` that

* initialises its own parameters: ``reset_parameters(std, scheme)`` with ``scheme`` ``normal``
  (N(0, std) weights, zero biases: BERT, GPT-2) or ``t5`` (fan-in-scaled, Mesh TensorFlow), so
  the builder never needs to know a block's internal layout (fused ``qkv`` rows, stacked experts);
* declares what its ``forward`` reads beyond the hidden states (``routed``: the feed-forward
  takes ``padding_mask`` and ``router_input``, as a mixture of experts does);
* declares whether its ``forward`` takes ``queries=n`` (``leading_queries``: self-attention that lets
  only the first n positions ask, as the last layer of a stack whose heads read only those does);
* reports auxiliary losses and metrics of its last forward through ``pop_aux`` (``has_aux``):
  MoE load balancing and router z-loss, which the model output carries beside the targets'.
"""

from __future__ import annotations

from typing import ClassVar, Literal

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
