"""Activation functions by name."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor


def quick_gelu(x: Tensor) -> Tensor:
    """CLIP's sigmoid approximation of GELU, x * sigmoid(1.702 x) (Hendrycks & Gimpel 2016)."""
    return x * (1.702 * x).sigmoid()


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact (erf) GELU, as in BERT
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"; TencentPretrain "gelu_fast"
    "relu": F.relu,
    "silu": F.silu,
    "tanh": F.tanh,
    "linear": lambda x: x,
    "quick_gelu": quick_gelu,  # CLIP
}
ACTIVATION_NAMES = tuple(ACTIVATIONS)

# The same functions overwriting their input (same values, bit for bit): for a fresh tensor that nothing
# else reads, outside autograd, where they save allocating (and, on CPU, page-faulting in) an output.
IN_PLACE_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_tanh": partial(torch.ops.aten.gelu_, approximate="tanh"),
    "relu": torch.relu_,
    "silu": partial(F.silu, inplace=True),
    "tanh": torch.tanh_,
    "linear": lambda x: x,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    return ACTIVATIONS[name]


def get_in_place_activation(name: str) -> Callable[[Tensor], Tensor] | None:
    """The in-place form of activation ``name`` (see ``IN_PLACE_ACTIVATIONS``), None if it has none."""
    return IN_PLACE_ACTIVATIONS.get(name)
