"""``train.precision``: the dtype of the weights, of the compute and of the optimizer state, and the
throughput accounting that depends on the device (synchronisation, peak memory, model FLOPs).

=============  ====================  ===========================  ================  =======================
mode           weights               compute                      optimizer state   where
=============  ====================  ===========================  ================  =======================
``fp32``       fp32                  fp32 (TF32 off)              fp32              everywhere
``tf32``       fp32                  TF32 matmuls/convolutions    fp32              GPUs of compute
                                                                                    capability >= 8 (on
                                                                                    others and CPUs: fp32)
``bf16``       fp32 (master)         bf16 autocast                fp32              everywhere
``bf16-true``  bf16                  bf16                         bf16              single, ddp
``fp16``       fp32 (master)         fp16 autocast + GradScaler   fp32              GPUs (single, ddp;
                                                                                    deepspeed: its fp16)
=============  ====================  ===========================  ================  =======================

``auto`` (the default) is ``tf32`` on a GPU of compute capability >= 8 (A100, H100, ...) and
``fp32`` elsewhere; the trainer states the choice in its log. ``bf16-true`` keeps no fp32 master
copy: the weights, gradients and AdamW moments are bf16 (half the memory of ``bf16``, at the cost of
updates smaller than bf16's resolution being lost); checkpoints then hold bf16 weights.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch
from torch import nn

from pentad.errors import UserError
from pentad.layers.transformer import TransformerStack

PRECISIONS = ("auto", "fp32", "tf32", "bf16", "bf16-true", "fp16")


def has_tf32(device: torch.device) -> bool:
    """Whether ``device`` is a GPU whose tensor cores compute TF32 (compute capability >= 8)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def resolve(precision: str, device: torch.device) -> str:
    """The mode ``precision`` means on ``device`` (``auto`` decided); ``fp16`` off a GPU is an error."""
    if precision == "auto":
        return "tf32" if has_tf32(device) else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"train.precision=fp16 needs a GPU (fp16 autocast with a gradient scaler), but the run "
                        f"is on {device.type}: use train.precision=bf16 (autocast) or bf16-true on a CPU")
    return precision


def apply_matmul_precision(precision: str, device: torch.device) -> None:
    """Set the process's TF32 switches for a resolved ``precision`` on a GPU: on for ``tf32``, off for
    ``fp32`` (true fp32); other modes leave torch's defaults. Nothing changes on a CPU."""
    if device.type != "cuda" or precision not in ("tf32", "fp32"):
        return
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


def describe(requested: str, precision: str, device: torch.device) -> str:
    """One log line on what the run computes in."""
    what = {"fp32": "fp32 weights and compute", "tf32": "fp32 weights, TF32 matmuls",
            "bf16": "fp32 weights, bf16 autocast", "bf16-true": "bf16 weights, compute and optimizer state",
            "fp16": "fp32 weights, fp16 autocast with a gradient scaler"}[precision]
    if precision == "tf32" and not has_tf32(device):
        what = "fp32 (this device has no TF32: fp32 compute)"
    note = f" (train.precision=auto on {device.type})" if requested == "auto" else ""
    if requested == "auto" and device.type == "cpu" and cpu_has_bf16_units():
        note += ("; this CPU has bf16 matrix units (AMX): train.precision=bf16-true or bf16 may train faster "
                 "(docs/training.md, Precision)")
    return f"precision {precision}: {what}{note}"


def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (Intel AMX tiles), where oneDNN's bf16
    products run several times faster than float32 ones; elsewhere bf16 products are emulated and slower."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private in torch 2.x; absent: assume not
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def param_dtype(precision: str) -> torch.dtype | None:
    """The dtype the weights are cast to before training (None: they stay fp32)."""
    return torch.bfloat16 if precision == "bf16-true" else None


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of forward (None: no autocast)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def make_grad_scaler(precision: str, device: torch.device) -> Any:
    """A ``torch.amp.GradScaler`` for ``fp16``, None otherwise."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


# ---------------------------------------------------------------------------------- accounting
def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU, whose operations finish when called),
    so that a clock read after it measures work done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory so far: the GPU's allocated tensors on cuda, else the process's max resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2 ** 30 if sys.platform == "darwin" else 2 ** 20)


# Dense (no sparsity) peak TFLOP/s per GPU by the name torch reports, for MFU when train.peak_tflops is
# not set: (16-bit tensor cores, TF32 tensor cores, plain fp32). Vendors' data sheets, SXM parts.
PEAK_TFLOPS: dict[str, tuple[float, float, float]] = {
    "H200": (989.0, 494.0, 67.0),
    "H100": (989.0, 494.0, 67.0),
    "A100": (312.0, 156.0, 19.5),
}


def peak_tflops(precision: str, device: torch.device, configured: float | None) -> float | None:
    """The peak TFLOP/s that MFU divides by: ``train.peak_tflops`` if set, else the table's entry for
    a known GPU in this precision, else None (no MFU logged)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (half, tf32, fp32) in PEAK_TFLOPS.items():
        if key in name:
            return half if precision in ("bf16", "bf16-true", "fp16") else tf32 if precision == "tf32" else fp32
    return None


def model_flops_per_token(model: nn.Module) -> tuple[float, float]:
    """Training FLOPs per token, ``6 N + 12 L H S`` (forward + backward; Kaplan et al. 2020, PaLM's
    appendix B), as the pair ``(6 N, 12 L H)`` to be completed with the sequence length S: N trainable
    parameters (a tied one counted once), and over the transformer stacks L layers of attention
    width H (heads x head size): the attention scores and their weighted sum over S positions.
    A frozen parameter (LoRA's base) counts 4 instead of 6: forward and the input's gradient, no
    gradient of its own."""
    # parameters() lists a tied one once
    linear = sum(p.numel() * (6 if p.requires_grad else 4) for p in model.parameters())
    attention = sum(m.num_layers * m.num_heads * m.head_size for m in model.modules()
                    if isinstance(m, TransformerStack))
    return float(linear), 12.0 * attention
