"""Int8 linear layers for inference: per-channel symmetric int8 weights, activations quantized on the fly.

:class:`QuantizedLinear` keeps plain tensors only (``weight_int8`` int8 [out, in], ``weight_scale`` fp32
[out], ``bias``), so its weights are saved and read back with safetensors like any other, never pickled.
The weights of output row ``o`` are ``weight_int8[o] * weight_scale[o]`` (round to nearest of
``w / scale``, ``scale = max|w[o]| / 127``).

On the CPU, with a quantized engine (x86/fbgemm, onednn, qnnpack), the forward runs PyTorch's
dynamic int8 kernel (``quantized::linear_dynamic``: each call quantizes its input per tensor, multiplies
in int8 with int32 accumulation, rescales to fp32), packed once from the int8 tensors and re-packed when
they change. Elsewhere (GPU, other dtypes) it multiplies by the de-quantized weights: weight-only int8,
the same numbers, memory saved but no speed-up. ``torch.ao.quantization.quantize_dynamic`` is deprecated
in the installed torch and its modules pickle their packed weights; this layer uses the kernel alone.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(int8 [out, in], fp32 scale [out]) of a weight [out, in]: symmetric, per output channel."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _kernel_available() -> bool:
    return "quantized" in dir(torch.ops) and torch.backends.quantized.engine != "none"


class QuantizedLinear(nn.Module):
    """A ``nn.Linear`` with int8 weights (see the module docstring); not trainable."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self._packed: tuple[tuple[int, ...], object] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantizedLinear:
        """The int8 version of ``linear`` (its weights quantized, its bias kept in fp32)."""
        q = cls(linear.in_features, linear.out_features, linear.bias is not None, device=linear.weight.device)
        int8, scale = quantize_weight(linear.weight)
        with torch.no_grad():
            q.weight_int8.copy_(int8)
            q.weight_scale.copy_(scale)
            if linear.bias is not None:
                q.bias.copy_(linear.bias.detach().float())
        return q

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.weight_int8.to(dtype) * self.weight_scale.to(dtype)[:, None]

    def _pack(self) -> object:
        tensors = [self.weight_int8, self.weight_scale] + ([self.bias] if self.bias is not None else [])
        key = tuple(v for t in tensors for v in (t.data_ptr(), t._version))
        if self._packed is None or self._packed[0] != key:
            with warnings.catch_warnings():  # quantized tensors are deprecated as a user API, the kernel is not
                warnings.simplefilter("ignore")
                qweight = torch._make_per_channel_quantized_tensor(
                    self.weight_int8, self.weight_scale.double(),
                    torch.zeros(self.out_features, dtype=torch.long), 0)
                bias = self.bias.float() if self.bias is not None else None
                self._packed = (key, torch.ops.quantized.linear_prepack(qweight, bias))
        return self._packed[1]

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32 and _kernel_available():
            shape = x.shape
            reduce_range = torch.backends.quantized.engine in ("x86", "fbgemm")  # 7-bit inputs: no int16 overflow
            out = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).contiguous(), self._pack(),
                                                     reduce_range)
            return out.reshape(*shape[:-1], self.out_features)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def rows(self, x: Tensor, start: int, end: int) -> Tensor:
        """Output rows ``start:end`` (:class:`~pentad.layers.block.RowProjection`): the whole int8
        product, sliced (the packed kernel multiplies every row)."""
        return self(x)[..., start:end]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def quantizable_linears(model: nn.Module, skip: tuple[str, ...] = ()) -> list[str]:
    """Names of the ``nn.Linear`` modules of ``model`` that :func:`quantize_linears` converts: every one whose
    weight no other module shares (a head tied to the word embedding keeps its fp32 table), that is not itself
    registered in several places, and whose name
    does not start with one of ``skip``."""
    counts: dict[int, int] = {}
    places: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            counts[id(p)] = counts.get(id(p), 0) + 1
    for _, module in model.named_modules(remove_duplicate=False):
        places[id(module)] = places.get(id(module), 0) + 1
    names = []
    for name, module in model.named_modules():
        if (type(module) is nn.Linear and counts.get(id(module.weight), 0) == 1 and places[id(module)] == 1
                and not name.startswith(skip)):
            names.append(name)
    return names


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ()) -> list[str]:
    """Replace the :func:`quantizable_linears` of ``model`` by :class:`QuantizedLinear` (in place); their
    names. Deterministic for a given module tree, so a model built from the same config gets the same set."""
    names = quantizable_linears(model, skip)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantizedLinear.from_linear(getattr(parent, child)))
    return names
