"""HunYuan dense (``model_type: hunyuan_v1_dense``: ``HunYuanDenseV1ForCausalLM``, Hunyuan-0.5B to -7B), both ways.

A LLaMA body (:mod:`pentad.interop.hf.qwen2`'s base: fused ``qkv``, RMSNorm, SwiGLU, rotary,
grouped-query heads) with a per-head RMSNorm on queries and keys applied *after* the rotary
rotation: pentad ``qk_norm: after_rotary`` (``self_attn.query_layernorm.weight`` /
``key_layernorm.weight`` [head_dim] -> ``attention.q_norm.weight`` / ``k_norm.weight``, eps
``rms_norm_eps``). transformers reads ``head_dim`` as given (None breaks its attention), so it is
always written.

RoPE: HunYuan's checkpoints label a fixed NTK stretch ``dynamic`` with an ``alpha``
(``rope_scaling: {type: dynamic, alpha: 1000.0, factor: 1.0, ...}``); transformers then ignores the
other keys and uses the base ``rope_theta * alpha ** (d / (d - 2))`` (d = ``head_dim``) at every
length, which is pentad's ``rotary_base`` (the same fp32 frequencies). Written back, a rotary base
that is still the imported one gets the imported RoPE keys as they were; any other is a plain
``rope_theta``. Without ``alpha`` the RoPE scaling kinds convert as for LLaMA. ``attention_bias``
true (biases on q, k, v and o, never on the feed-forward) is refused.
"""

from __future__ import annotations

from typing import Any

from pentad.interop.hf import Field, KeyLayout, mixture, owned_keys, positions, seq_length, text_kind
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY_FIELDS,
    ROPE_KEYS,
    rope_export,
    rope_kind,
    rope_scaling,
    rope_section,
    rope_theta,
)
from pentad.interop.hf.qwen2 import Qwen2Family, qk_norm

DEFAULTS: dict[str, Any] = {
    "vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "head_dim": None,
}
FIELDS: list[Field] = BODY_FIELDS + [Field("attention_bias", write=lambda m: False), ATTENTION_DROPOUT]


def ntk_alpha(config: dict[str, Any]) -> float | None:
    """The fixed NTK ``alpha`` of a HunYuan config.json's RoPE section (None: none)."""
    section = rope_section(config)
    alpha = section.get("alpha")
    return float(alpha) if rope_kind(section) == "dynamic" and alpha else None


def alpha_base(config: dict[str, Any], head_dim: int) -> float | None:
    """The rotary base transformers uses for a config.json with an NTK ``alpha`` (None: no alpha)."""
    alpha = ntk_alpha(config)
    if alpha is None:
        return None
    return rope_theta(config) * alpha ** (head_dim / (head_dim - 2))


def hunyuan_rotary(config: dict[str, Any], c: dict[str, Any], head_dim: int, max_length: int | None,
                   problems: list[str]) -> tuple[float, dict[str, Any] | None]:
    """(rotary base, pentad's rope_scaling or None) of a HunYuan config.json (``c``: defaults filled in)."""
    base = alpha_base(config, head_dim)
    if base is not None:
        if head_dim <= 2:
            problems.append(f"head_dim {head_dim} with an NTK alpha (the base is stretched by alpha ** (d / (d - 2)))")
        return base, None
    max_positions = int(c["max_position_embeddings"])
    scaling = rope_scaling(config, max_positions, seq_length(max_length, max_positions), head_dim, problems)
    return rope_theta(config), scaling


def hunyuan_rotary_export(model: Any, base: dict[str, Any]) -> dict[str, Any]:
    """config.json's RoPE keys: the imported ones where the rotary base is still their alpha's."""
    enc = model.encoder
    head = enc.head_size or model.hidden_size // enc.num_heads
    if enc.rope_scaling is None and alpha_base(base, head) == float(enc.rotary_base):
        return {k: base[k] for k in ROPE_KEYS if k in base}
    exported = rope_export(enc, {k: v for k, v in base.items() if ntk_alpha(base) is None or k not in ROPE_KEYS})
    return exported


class HunYuanDenseFamily(Qwen2Family):
    name = "hunyuan_v1_dense"
    model_types = ("hunyuan_v1_dense",)
    narrows = ("llama",)
    layout = KeyLayout(contains=(".self_attn.query_layernorm.",), also=(".mlp.gate_proj.",), rank=90)
    tokenizer_kind = "tokenizer_json"
    tokenizer_class = "PreTrainedTokenizerFast"
    default_special_tokens: dict[str, str] = {}

    architecture = "HunYuanDenseV1ForCausalLM"
    display = "HunYuan dense"
    defaults = DEFAULTS
    fields = FIELDS
    owned = owned_keys(FIELDS, *ROPE_KEYS)
    attention_bias_key = "attention_bias"
    qk_norm = "after_rotary"
    qk_norm_names = ("query_layernorm", "key_layernorm")
    derives_head_dim = False

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and qk_norm(model) == "after_rotary"

    def family_problems(self, config: dict[str, Any], c: dict[str, Any]) -> list[str]:
        return []  # transformers' HunYuan attention has no window

    def rotary(self, config: dict[str, Any], c: dict[str, Any], head_dim: int, max_length: int | None,
               problems: list[str]) -> tuple[float, dict[str, Any] | None]:
        return hunyuan_rotary(config, c, head_dim, max_length, problems)

    def rotary_export(self, model: Any, base: dict[str, Any]) -> dict[str, Any]:
        return hunyuan_rotary_export(model, base)


FAMILY = HunYuanDenseFamily()
