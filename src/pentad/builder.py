"""The only place where a config meets a module: ``build_model`` assembles the five slots."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from pentad.errors import ConfigError, ConfigProblem, UserError
from pentad.model import EmbeddingSlot, Model
from pentad.registry import EMBEDDINGS, ENCODERS, TARGETS


def model_problems(cfg: Any) -> list[ConfigProblem]:
    """Checks that need more than one field (sizes that must agree, values set by a task)."""
    problems: list[ConfigProblem] = []
    if cfg.vocab_size is None and any(p.type == "word" for p in cfg.embedding.parts):
        problems.append(ConfigProblem("model.vocab_size", "not set: give a tokenizer (its vocabulary "
                                      "sets it) or set model.vocab_size=N"))
    names = [p.type for p in cfg.embedding.parts]
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(ConfigProblem(f"model.embedding.parts.{i}", f"embedding part '{name}' appears twice"))
    for path, sub in (("model.encoder", cfg.encoder),):
        for key, msg in getattr(sub, "check", lambda m: [])(cfg):
            problems.append(ConfigProblem(f"{path}.{key}", msg))
    seen: set[str] = set()
    for i, target in enumerate(cfg.targets):
        if target.target_name in seen:
            problems.append(ConfigProblem(f"model.targets.{i}.name", f"two targets are named "
                                          f"'{target.target_name}'; give one a distinct name"))
        seen.add(target.target_name)
        for key, msg in getattr(target, "check", lambda m: [])(cfg):
            problems.append(ConfigProblem(f"model.targets.{i}.{key}", msg))
    return problems


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) weights, zero biases, unit norms (BERT / GPT-2 initialisation)."""
    from pentad.components.base import EmbeddingPart

    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, EmbeddingPart) and isinstance(getattr(module, "weight", None), nn.Parameter):
            nn.init.normal_(module.weight, std=std)


def build_model(cfg: Any, provided: Iterable[str] | None = None, device: str | torch.device | None = None,
                training: bool = True) -> Model:
    """Build the model of a ``ModelConfig``.

    provided: the Batch fields the objective or task fills (labels as ``labels.<target>``); when
    given, every field a module requires must be in it, else a ConfigError says which is missing.
    device: ``"meta"`` builds without memory (for parameter counts); weights are initialised
    otherwise. training: whether targets need their labels.
    """
    problems = model_problems(cfg)
    if problems:
        raise ConfigError(problems, "the model config is inconsistent")
    on_meta = device is not None and torch.device(device).type == "meta"
    with torch.device(device) if device is not None else nullcontext():
        parts = {p.type: EMBEDDINGS.get(p.type).from_config(p, cfg) for p in cfg.embedding.parts}
        embedding = EmbeddingSlot(parts, cfg.hidden_size, cfg.embedding.norm, cfg.embedding.layer_norm_eps,
                                  cfg.embedding.dropout)
        encoder = ENCODERS.get(cfg.encoder.type).from_config(cfg.encoder, cfg)
        targets = {t.target_name: TARGETS.get(t.type).from_config(t, cfg) for t in cfg.targets}
        model = Model(embedding, encoder, targets)
    if cfg.tie_word_embeddings:
        weight = embedding.word_embedding_weight()
        if weight is not None:
            for name, target in targets.items():
                if target.tie_to(weight):
                    model.tied.append((f"targets.{name}.output.weight", "embedding.word.weight"))
    if not on_meta:
        with torch.no_grad():
            init_weights(model, cfg.init_std)
    if provided is not None:
        check_requirements(model, set(provided), training)
    return model


def check_requirements(model: Model, provided: set[str], training: bool = True) -> None:
    """Every Batch field a module reads must be provided by the objective or task."""
    missing: list[str] = []
    for part_name in model.embedding.part_names:
        part = getattr(model.embedding, part_name)
        missing += [f"embedding part '{part_name}' needs Batch.{f}" for f in part.requires if f not in provided]
    for f in getattr(model.encoder, "requires", ()):
        if f not in provided:
            missing.append(f"encoder '{model.encoder.registry_name}' needs Batch.{f}")
    for name, target in model.targets.items():
        for f in target.required_fields(training):
            if f not in provided:
                missing.append(f"target '{name}' needs Batch.{f}")
    if missing:
        raise UserError("the data does not provide what the model reads: " + "; ".join(missing)
                        + f". The objective/task provides: {', '.join(sorted(provided)) or 'nothing'}. "
                        "Pick an objective that provides these fields, or change the model's slots.")


def summarize(model: Model) -> str:
    """Modules per slot with their parameter counts, and the unique total (tied weights once)."""
    from pentad.model import count_parameters

    def n(m: nn.Module) -> str:
        return f"{sum(p.numel() for p in m.parameters()):,}"

    lines = ["embedding: " + ", ".join(
        f"{name} ({n(getattr(model.embedding, name))})" for name in model.embedding.part_names)
        + (" + norm" if model.embedding.norm is not None else "")]
    enc = model.encoder
    layers = getattr(enc, "layers", None)
    lines.append(f"encoder: {enc.registry_name}" + (f" x{len(layers)} layers" if layers is not None else "")
                 + (f", mask {enc.mask_kind}" if hasattr(enc, "mask_kind") else "") + f" ({n(enc)})")
    lines.append("targets: " + ", ".join(f"{name}: {t.registry_name} ({n(t)})" for name, t in model.targets.items()))
    if model.tied:
        lines.append("tied: " + ", ".join(f"{a} = {b}" for a, b in model.tied))
    lines.append(f"parameters: {count_parameters(model):,}")
    return "\n".join(lines)
