"""The only place where a config meets a module: ``build_model`` assembles the five slots."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pentad import memory
from pentad.components.stream import build_streams, stream_problems
from pentad.config.sizes import SlotSizes
from pentad.errors import ConfigError, ConfigProblem, UserError
from pentad.layers.attention import Attention
from pentad.layers.block import Block
from pentad.layers.feed_forward import FeedForward
from pentad.layers.pruning import keep_heads, keep_neurons, prunable_heads
from pentad.layers.quantized import quantize_linears
from pentad.model import EmbeddingSlot, Model
from pentad.registry import DECODERS, EMBEDDINGS, ENCODERS, TARGETS

if TYPE_CHECKING:
    from pentad.config.base import SlotConfig
    from pentad.config.embedding import EmbeddingConfigBase
    from pentad.config.model import CompressionConfig, ModelConfigBase


def model_problems(cfg: ModelConfigBase) -> list[ConfigProblem]:
    """Checks that need more than one field (sizes that must agree, values set by a task)."""
    problems: list[ConfigProblem] = []
    if cfg.vocab_size is None and any("tokens" in EMBEDDINGS.get(p.type).requires for p in cfg.embedding.parts):
        problems.append(ConfigProblem("model.vocab_size", "not set: give a tokenizer (its vocabulary "
                                      "sets it) or set model.vocab_size=N"))
    slots = [("model.embedding", cfg.embedding)]
    if cfg.target_embedding is not None:
        slots.append(("model.target_embedding", cfg.target_embedding))
    for path, slot in slots:
        names = [p.type for p in slot.parts]
        for i, name in enumerate(names):
            if name in names[:i]:
                problems.append(ConfigProblem(f"{path}.parts.{i}", f"embedding part '{name}' appears twice"))
        leads = [name for name in names if getattr(EMBEDDINGS.get(name), "defines_sequence", False)]
        if len(leads) != 1:
            kinds = sorted(n for n, c in EMBEDDINGS.items() if getattr(c, "defines_sequence", False))
            problems.append(ConfigProblem(f"{path}.parts", f"found {len(leads)} parts that make the sequence "
                                          f"({', '.join(leads) or 'none'}) among {names}; a slot needs exactly "
                                          f"one of {', '.join(kinds)}, the others (positions, segments) add to it"))
        for i, part in enumerate(slot.parts):
            for key, msg in getattr(part, "check", lambda m: [])(cfg):
                problems.append(ConfigProblem(f"{path}.parts.{i}.{key}", msg))
    if (cfg.decoder is None) != (cfg.target_embedding is None):
        have, lack = ("decoder", "target_embedding") if cfg.decoder is not None else ("target_embedding", "decoder")
        problems.append(ConfigProblem(f"model.{lack}", f"missing: model.{have} is set, and an encoder-decoder "
                                      f"model needs both a decoder and a target_embedding slot"))
    if cfg.share_embedding and cfg.decoder is not None and cfg.target_vocab_size not in (None, cfg.vocab_size):
        problems.append(ConfigProblem("model.share_embedding", f"the encoder and target vocabularies differ "
                                      f"({cfg.vocab_size} vs {cfg.target_vocab_size}), so they cannot share "
                                      "one word table; set share_embedding=false"))
    for path, sub in (("model.encoder", cfg.encoder), ("model.decoder", cfg.decoder)):
        if sub is None:
            continue
        for key, msg in getattr(sub, "check", lambda m: [])(cfg):
            problems.append(ConfigProblem(f"{path}.{key}", msg))
    problems += [ConfigProblem(path, msg) for path, msg in stream_problems(cfg)]
    seen: set[str] = set()
    for i, target in enumerate(cfg.targets):
        if target.target_name in seen:
            problems.append(ConfigProblem(f"model.targets.{i}.name", f"two targets are named "
                                          f"'{target.target_name}'; give one a distinct name"))
        seen.add(target.target_name)
        for key, msg in getattr(target, "check", lambda m: [])(cfg):
            problems.append(ConfigProblem(f"model.targets.{i}.{key}", msg))
    return problems


def _reads_embedding_width(encoder_cfg: SlotConfig) -> bool:
    """Recurrent/convolutional encoders read the embedding at its own width (no projection)."""
    return bool(getattr(ENCODERS.get(encoder_cfg.type), "takes_embedding_width", False))


def _input_slot(slot_cfg: Any, sizes: Any, encoder_cfg: Any) -> EmbeddingSlot:
    """The embedding slot of a stream (the model's own, or a second stream's with the sizes it sees)
    feeding an encoder of config ``encoder_cfg``."""
    width = sizes.embedding_size or sizes.hidden_size
    return _embedding_slot(slot_cfg, sizes, SlotSizes(sizes, hidden_size=width),
                           not _reads_embedding_width(encoder_cfg))


def _preorder(module: nn.Module, seen: set[int]) -> Iterable[nn.Module]:
    """``module.modules()`` order (each module once), except that a block's children are left to it."""
    if id(module) in seen:
        return
    seen.add(id(module))
    yield module
    if isinstance(module, Block):
        return
    for child in module.children():
        yield from _preorder(child, seen)


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) weights, zero biases, unit norms (BERT / GPT-2 initialisation); RMSNorm
    scales start at one (never random, unlike TencentPretrain). Transformer blocks (attention,
    feed-forward, experts, position bias) and embedding parts (a patch projection is a convolution)
    initialise themselves (``Block.reset_parameters``, ``EmbeddingPart.initialise``)."""
    from pentad.components.base import EmbeddingPart
    from pentad.components.norms import is_norm

    for module in _preorder(model, set()):
        if isinstance(module, Block):
            module.reset_parameters(std, "normal")
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif is_norm(module):  # a registered norm kind's module (components/norms): unit scale, zero bias
            module.reset_parameters()
        elif isinstance(module, EmbeddingPart):
            module.initialise(std)


def init_torch_default(model: Model, target: str) -> None:
    """torch's default initialisation for every layer of the head ``target`` that has one
    (``reset_parameters``: a Linear's weights and biases uniform within +-1/sqrt(fan_in), unit norms,
    N(0, 1) embeddings), as a head built with torch's layers and never re-initialised starts
    (TencentPretrain's fine-tuning heads); a layer whose weight is tied to another (a head sharing the
    word table) is left as it is."""
    prefix = f"targets.{target}."
    tied = {name[len(prefix):].rsplit(".", 1)[0] for name, _ in model.tied if name.startswith(prefix)}
    for name, layer in model.targets[target].named_modules():
        if name not in tied and isinstance(layer, (nn.Linear, nn.Embedding, nn.LayerNorm, nn.modules.conv._ConvNd)):
            layer.reset_parameters()


def init_t5(model: nn.Module) -> None:
    """T5's initialisation (Mesh TensorFlow, as in Raffel et al.): unit-variance embeddings and
    fan-in-scaled projections (each block's ``reset_parameters(scheme="t5")``). T5 has no 1/sqrt(d)
    in attention and scales the tied output by d^-0.5, so with the BERT-style N(0, 0.02) everywhere
    its logits start near zero and it learns slowly from scratch. Applied after ``init_weights``."""
    from pentad.components.base import EmbeddingPart

    for module in model.modules():
        if isinstance(module, Block):
            module.reset_parameters(scheme="t5")
        elif isinstance(module, EmbeddingPart) and isinstance(getattr(module, "weight", None), nn.Parameter):
            nn.init.normal_(module.weight, std=1.0)
    for target in getattr(model, "targets", {}).values():
        output = getattr(target, "output", None)
        if isinstance(output, nn.Linear) and not any(head == f"targets.{target.name}.output.weight"
                                                     for head, _ in getattr(model, "tied", [])):
            nn.init.normal_(output.weight, std=1.0)


def build_model(cfg: ModelConfigBase, provided: Iterable[str] | None = None, device: str | torch.device | None = None,
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
    width = cfg.embedding_size or cfg.hidden_size
    with torch.device(device) if device is not None else nullcontext():
        # The first (or only) stream is the embedding and encoder slots; a second stream's own modules
        # are built after them (the order modules are built and initialised in).
        embedding = _input_slot(cfg.embedding, cfg, cfg.encoder)
        encoder = ENCODERS.get(cfg.encoder.type).from_config(cfg.encoder, cfg)
        streams, plan = build_streams(cfg, _input_slot)
        target_embedding = decoder = None
        if cfg.decoder is not None:
            target_vocab = cfg.target_vocab_size or cfg.vocab_size
            target_embedding = _embedding_slot(cfg.target_embedding, cfg,
                                               SlotSizes(cfg, hidden_size=width, vocab_size=target_vocab))
            decoder = DECODERS.get(cfg.decoder.type).from_config(cfg.decoder, cfg)
        head_sizes = SlotSizes(cfg, vocab_size=cfg.output_vocab_size)
        targets = {t.target_name: TARGETS.get(t.type).from_config(t, head_sizes) for t in cfg.targets}
        model = Model(embedding, encoder, targets, target_embedding, decoder, streams, plan)
    if cfg.share_embedding and target_embedding is not None:
        source = embedding.word_embedding_weight()
        if source is not None and target_embedding.word_embedding_weight() is not None:
            target_embedding.word.weight = source
            model.tied.append(("target_embedding.word.weight", "embedding.word.weight"))
    if cfg.tie_word_embeddings:
        tie_slot, slot_name = (target_embedding, "target_embedding") if target_embedding is not None else (
            embedding, "embedding")
        weight = tie_slot.word_embedding_weight()
        if weight is not None:
            own = f"{slot_name}.{tie_slot.word_table_name()}"
            shared = dict(model.tied).get(own, own)
            for name, target in targets.items():
                if target.tie_to(weight):
                    model.tied.append((f"targets.{name}.output.weight", shared))
    if not on_meta:
        with torch.no_grad():
            init_weights(model, cfg.init_std)
            if cfg.init == "t5":
                init_t5(model)
            for target_cfg in cfg.targets:
                if target_cfg.init == "torch":
                    init_torch_default(model, target_cfg.target_name)
    if cfg.compression is not None:
        apply_compression(model, cfg.compression)
    if provided is not None:
        check_requirements(model, set(provided), training)
    return model


def check_memory(cfg: ModelConfigBase, what: str, device: str | torch.device | None = None) -> None:
    """Refuse (UserError) a model whose weights cannot fit in the memory available on the CPU (where it
    is built) and on ``device`` (where it will run), before any of it is allocated: the weights are
    counted on the meta device (``PENTAD_SKIP_MEMORY_CHECK=1`` skips this; :mod:`pentad.memory`).
    ``what``: what the model is built for (``"generating"``)."""
    weights, _ = memory.tensor_bytes(build_model(cfg, device="meta", training=False))
    hint = "Make the model smaller (model.hidden_size, num_layers, ffn_size, vocab_size, the number of experts)"
    for where in dict.fromkeys(["cpu", str(torch.device(device)) if device is not None else "cpu"]):
        memory.require(weights, f"{what} with this model", "its weights", where, hint)


def apply_compression(model: Model, compression: CompressionConfig) -> None:
    """Give ``model`` (just built at full size) the shapes ``model.compression`` records: attention blocks
    with fewer heads, feed-forward blocks of smaller width, then int8 linear layers; the weights are read
    afterwards (``pentad compress``, docs/compress.md)."""
    problems: list[ConfigProblem] = []
    for section, kind, names in (("heads", Attention, compression.heads), ("ffn", FeedForward, compression.ffn)):
        for name, size in names.items():
            path = f"model.compression.{section}.{name}"
            try:
                module = model.get_submodule(name)
            except AttributeError:
                problems.append(ConfigProblem(path, "no such module in this model"))
                continue
            if not isinstance(module, kind):
                problems.append(ConfigProblem(path, f"{name} is a {type(module).__name__}, not a "
                                              f"{kind.__name__}"))
                continue
            full = module.num_heads if kind is Attention else module.up.out_features
            why = prunable_heads(module) if kind is Attention else None
            if why is not None:
                problems.append(ConfigProblem(path, f"its heads cannot be pruned: {why}"))
            elif not 1 <= size <= full:
                problems.append(ConfigProblem(path, f"{size} is not between 1 and the block's full size {full}"))
            elif kind is Attention:
                keep_heads(module, list(range(size)))
            else:
                keep_neurons(module, list(range(size)))
    if problems:
        raise ConfigError(problems, "model.compression does not fit this model")
    if compression.quantize == "int8":
        quantize_linears(model)


def _embedding_slot(slot_cfg: EmbeddingConfigBase, cfg: ModelConfigBase, sizes: SlotSizes,
                    project: bool = True) -> EmbeddingSlot:
    parts = {p.type: EMBEDDINGS.get(p.type).from_config(p, sizes) for p in slot_cfg.parts}
    return EmbeddingSlot(parts, cfg.hidden_size, slot_cfg.norm, slot_cfg.layer_norm_eps, slot_cfg.dropout,
                         sizes.hidden_size, project, norm_kind=slot_cfg.norm_kind,
                         second_norm=slot_cfg.second_norm)


def check_requirements(model: Model, provided: set[str], training: bool = True) -> None:
    """Every Batch field a module reads must be provided by the objective or task."""
    missing: list[str] = []
    for part_name in model.embedding.part_names:
        part = getattr(model.embedding, part_name)
        missing += [f"embedding part '{part_name}' needs Batch.{f}" for f in part.requires if f not in provided]
    for f in getattr(model.encoder, "requires", ()):
        if f not in provided:
            missing.append(f"encoder '{model.encoder.registry_name}' needs Batch.{f}")
    plan = model.stream_plan
    if plan is not None:
        missing += [f"{what} needs Batch.{f}" for what, f in plan.requirements(model) if f not in provided]
    if model.target_embedding is not None:
        for part_name in model.target_embedding.part_names:
            part = getattr(model.target_embedding, part_name)
            missing += [f"target embedding part '{part_name}' needs Batch.decoder_{f}" for f in part.requires
                        if f"decoder_{f}" not in provided]
    for name, target in model.targets.items():
        for f in target.required_fields(training):
            if f not in provided:
                missing.append(f"target '{name}' needs Batch.{f}")
    if missing:
        pair_hint = plan.requirements_hint() if plan is not None else ""
        raise UserError("the data does not provide what the model reads: " + "; ".join(missing)
                        + f". The objective/task provides: {', '.join(sorted(provided)) or 'nothing'}. "
                        "Pick an objective that provides these fields, or change the model's slots." + pair_hint)


def summarize(model: Model) -> str:
    """Modules per slot with their parameter counts, and the unique total (tied weights once)."""
    from pentad.model import count_active_parameters, count_parameters

    def n(m: nn.Module) -> str:
        return f"{sum(p.numel() for p in m.parameters()):,}"

    lines = ["embedding: " + ", ".join(
        f"{name} ({n(getattr(model.embedding, name))})" for name in model.embedding.part_names)
        + (" + norm" if model.embedding.norm is not None else "")]
    enc = model.encoder
    layers = getattr(enc, "layers", None)
    lines.append(f"encoder: {enc.registry_name}" + (f" x{getattr(enc, 'num_layers', len(layers))} layers"
                                                     if layers is not None else "")
                 + (f", mask {enc.mask_kind}" if hasattr(enc, "mask_kind") else "") + f" ({n(enc)})")
    if model.stream_plan is not None:
        lines.append(model.stream_plan.describe(model))
    if model.decoder is not None:
        lines.append("target embedding: " + ", ".join(
            f"{name} ({n(getattr(model.target_embedding, name))})" for name in model.target_embedding.part_names))
        dec = model.decoder
        dec_layers = getattr(dec, "layers", None)
        lines.append(f"decoder: {dec.registry_name}" + (f" x{dec.num_layers} layers" if dec_layers is not None else "")
                     + f" ({n(dec)})")
    lines.append("targets: " + ", ".join(f"{name}: {t.registry_name} ({n(t)})" for name, t in model.targets.items()))
    if model.tied:
        lines.append("tied: " + ", ".join(f"{a} = {b}" for a, b in model.tied))
    total, active = count_parameters(model), count_active_parameters(model)
    lines.append(f"parameters: {total:,}" + (f" ({active:,} active per token)" if active != total else ""))
    return "\n".join(lines)
