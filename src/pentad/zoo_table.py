"""The zoo as a table (``pentad list zoo --table``; ``docs/zoo.md`` embeds it): family -> modules per
slot -> objective -> parameters, computed from the recipes and the registry, never written by hand."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

START, END = "<!-- zoo-table:start -->", "<!-- zoo-table:end -->"


@cache
def published() -> dict[str, dict[str, Any]]:
    """``zoo/published.yaml``: recipe -> {params, tolerance, source}."""
    text = (resources.files("pentad") / "zoo" / "published.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _stack(cfg: Any, hidden: int) -> str:
    """One line for an encoder/decoder config."""
    if cfg.type != "transformer":
        shown = ("num_layers", "kernel_size", "block_size", "bidirectional")
        extra = ", ".join(f"{k}={v}" for k, v in cfg.model_dump().items() if k in shown and v not in (None, False))
        return f"{cfg.type} ({extra})" if extra else cfg.type
    heads = f"{cfg.num_heads} heads" + (f" / {cfg.num_kv_heads} kv" if cfg.num_kv_heads else "")
    latent = getattr(cfg, "latent_attention", None)
    if latent is not None:
        heads += f" of latent attention (kv rank {latent.kv_lora_rank}, q rank {latent.q_lora_rank})"
    ffn = cfg.ffn
    if ffn == "moe":
        moe = cfg.moe_config
        ffn = (f"moe {moe.num_experts}×{moe.expert} " + ("expert-choice" if moe.routing == "expert_choice"
                                                          else f"top-{moe.top_k}")
               + (f" every {moe.every}" if moe.every > 1 else "")
               + (f" from layer {moe.first}" if moe.first else "")
               + (f" +{moe.shared_experts} shared" if moe.shared_experts else "")
               + (f", {moe.scoring}" if moe.scoring != "softmax" else ""))
    bits = [f"{cfg.num_layers}×{hidden}", heads, f"{ffn} {cfg.activation}", f"{cfg.norm_position}-{cfg.norm}"]
    if getattr(cfg, "mask", None):
        bits.append(cfg.mask)
    if cfg.positions != "none":
        bits.append(cfg.positions)
    if cfg.sliding_window is not None:
        pattern = cfg.window_pattern or ["local"]
        local = sum(p == "local" for p in pattern)
        bits.append(f"window {cfg.sliding_window}"
                    + ("" if local == len(pattern) else f" in {local} of {len(pattern)} layers"))
    if cfg.share_layers:
        bits.append("shared layer")
    if not cfg.bias:
        bits.append("no bias" + (" but qkv" if cfg.qkv_bias else ""))
    if getattr(cfg, "qk_norm", None):
        bits.append(f"qk-norm {cfg.qk_norm.replace('_', ' ')}")
    return "transformer " + ", ".join(bits)


def _embedding(slot: Any, width: int | None) -> str:
    parts = "+".join(f"{p.type}{p.patch_size}" if p.type in ("patch", "masked_patch") else p.type for p in slot.parts)
    return parts + (" +norm" if slot.norm else "") + (f" (E={width})" if width else "")


def _streams(m: Any) -> str:
    """One cell for the two streams of a model with ``model.streams``."""
    from pentad.components.stream import stream_embedding, stream_encoder, stream_sizes

    (first, one), (second, two) = m.streams.items()
    text = f"{first}: {_embedding(m.embedding, m.embedding_size)} → {_stack(m.encoder, m.hidden_size)}, {one.pooling}"
    if two.share is not None:
        return f"streams ({text}; {second}: shares {first}'s, {two.pooling})"
    sizes = stream_sizes(m, second)
    other = (f"{second}: {_embedding(stream_embedding(m, second), two.embedding_size)} → "
             f"{_stack(stream_encoder(m, second), sizes.hidden_size)}, {two.pooling}")
    return f"streams ({text}; {other})"


def rows() -> list[dict[str, str]]:
    from pentad.assembly import load_config
    from pentad.builder import build_model
    from pentad.config.loader import zoo_names
    from pentad.model import count_active_parameters, count_parameters

    table = []
    for name in zoo_names():
        cfg = load_config(name)
        m = cfg.model
        model = build_model(m, device="meta")
        count, active = count_parameters(model), count_active_parameters(model)
        slots = [_embedding(m.embedding, m.embedding_size), _stack(m.encoder, m.hidden_size)]
        if m.streams:
            slots = [_streams(m)]
        if m.decoder is not None:
            slots += [_embedding(m.target_embedding, None), _stack(m.decoder, m.hidden_size)]
        slots.append("+".join(t.target_name for t in m.targets))
        entry = published().get(name, {})
        figure = entry.get("source", "")
        objective = cfg.data.objective.type if cfg.data.objective is not None else f"task {cfg.task.type}"
        table.append({"recipe": name, "modules": " → ".join(slots), "objective": objective,
                      "parameters": f"{count:,}" + (f" ({active:,} active)" if active != count else ""),
                      "published": figure})
    return table


def markdown() -> str:
    """The table in Markdown, between the markers docs/zoo.md uses."""
    lines = [START, "| recipe | embedding → encoder → (target embedding → decoder) → targets | objective | "
             "parameters | published figure |", "|---|---|---|---:|---|"]
    for row in rows():
        lines.append(f"| {row['recipe']} | {row['modules']} | {row['objective']} | {row['parameters']} | "
                     f"{row['published']} |")
    lines.append(END)
    return "\n".join(lines)
