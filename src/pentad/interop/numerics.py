"""Norm kinds across formats, and what changing one does to a model's outputs, measured.

TencentPretrain's default LayerNorm (pentad's ``layernorm_unbiased``) has no counterpart in
Hugging Face Transformers, and torch's LayerNorm (pentad's ``layernorm``) none in TencentPretrain.
A conversion that has to put one in place of the other reports the relative difference of the
outputs it causes, measured on the model's own weights and a sample batch, rather than a formula.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pentad.builder import build_model
from pentad.components.base import Batch
from pentad.components.model_config import model_config_class
from pentad.training.checkpoint import load_weights

# Largest model (parameters) whose outputs a conversion measures: it builds the model twice in fp32.
MEASURE_LIMIT = 400_000_000
# Config fields that name a norm kind (the embedding slot's ``norm`` is a switch, not a kind).
KIND_FIELDS = ("norm", "norm_kind", "final_norm_kind")


def norm_places(model_cfg: Any, kind: str) -> list[str]:
    """Dotted config paths (``model.encoder.norm``, ``model.targets.0.norm`` ...) whose norm kind is
    ``kind`` (a stack's final norm without a ``final_norm_kind`` of its own is the layers' kind)."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in KIND_FIELDS and item == kind:
                    found.append(f"{path}.{key}")
                else:
                    walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}.{i}")

    walk(model_cfg.model_dump(), "model")
    return found


def swap_norm_kinds(model_cfg: Any, old: str, new: str) -> Any:
    """The model config with every norm of kind ``old`` made ``new`` (weights keep their names)."""

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: (new if k in KIND_FIELDS and v == old else swap(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return value

    return model_config_class().model_validate(swap(model_cfg.model_dump()))


def _outputs(model_cfg: Any, tensors: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
    """The last hidden states of each stack and every target's logits (labels left out)."""
    model = build_model(model_cfg)
    load_weights(model, tensors, "the weights being converted")
    model = model.float().eval()
    unlabelled = Batch(**{**vars(batch), "labels": {}})
    with torch.no_grad():
        hidden, mask = model.encode(unlabelled)
        out = {"encoder output": hidden}
        if model.decoder is not None:
            out["decoder output"] = model.decode(unlabelled, hidden, mask)
        for name, target in model(unlabelled).items():
            if getattr(target, "logits", None) is not None:
                out[f"{name} logits"] = target.logits
    return out


def relative_output_difference(cfg_a: Any, tensors_a: dict[str, Tensor], cfg_b: Any, tensors_b: dict[str, Tensor],
                               batch: Batch) -> dict[str, float]:
    """max |a - b| / max |a| per output (stack outputs and logits) of model a and model b on ``batch``.

    Padding positions are left out of the stack outputs (they hold values no one reads)."""
    a, b = _outputs(cfg_a, tensors_a, batch), _outputs(cfg_b, tensors_b, batch)
    keep = {"encoder output": None if batch.padding_mask is None else ~batch.padding_mask,
            "decoder output": None if getattr(batch, "decoder_padding_mask", None) is None
            else ~batch.decoder_padding_mask}
    found: dict[str, float] = {}
    for name, ref in a.items():
        other = b.get(name)
        if other is None or other.shape != ref.shape:
            found[name] = float("inf")
            continue
        mask = keep.get(name)
        if mask is not None and ref.dim() >= 2 and tuple(mask.shape) == tuple(ref.shape[:2]):
            ref, other = ref[mask], other[mask]
        scale = float(ref.double().abs().max()) if ref.numel() else 0.0
        diff = float((ref.double() - other.double()).abs().max()) if ref.numel() else 0.0
        found[name] = diff / scale if scale else diff
    return found


def describe(differences: dict[str, float]) -> str:
    """``encoder output 1.2e-03, mlm logits 8.0e-04`` (relative to the output's largest magnitude)."""
    return ", ".join(f"{name} {value:.1e}" for name, value in differences.items())


def measured_difference(cfg_a: Any, tensors_a: dict[str, Tensor], cfg_b: Any, tensors_b: dict[str, Tensor],
                        batch: Batch, limit: int = MEASURE_LIMIT) -> str:
    """How much model b's outputs differ from model a's, as a phrase: ``by encoder output 1.2e-03, ...
    (relative to ...)``; a model above ``limit`` parameters is not built twice in fp32 just to word a
    note, and the phrase says so."""
    size = sum(t.numel() for t in tensors_a.values())
    if size > limit:
        return (f"by about 1/(2 x hidden size) relative per norm changed (not measured: the model's "
                f"{size / 1e6:.0f}M parameters are above the {limit / 1e6:.0f}M up to which it is run twice)")
    found = describe(relative_output_difference(cfg_a, tensors_a, cfg_b, tensors_b, batch))
    return f"by {found} (relative to the largest value, measured on a sample batch)"
