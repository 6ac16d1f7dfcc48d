"""Qwen3 dense (``model_type: qwen3``: ``Qwen3ForCausalLM``), both ways.

Qwen2's LLaMA body (:mod:`pentad.interop.hf.qwen2`) without its query/key/value biases and with a
per-head RMSNorm on queries and keys before the rotary rotation: pentad ``qk_norm: before_rotary``
(``self_attn.q_norm.weight`` / ``k_norm.weight`` [head_dim] -> ``attention.q_norm.weight`` /
``k_norm.weight``; their eps is ``rms_norm_eps``, the stack's). ``head_dim`` is its own key (128 in
every published size, whatever hidden_size / heads is) and is always written. RoPE scaling converts
as for LLaMA; sliding-window layers are refused as for Qwen2. ``attention_bias`` true (biases on
q, k, v and o but not the feed-forward) is refused: pentad's one bias switch covers both.
"""

from __future__ import annotations

from typing import Any

from pentad.interop.hf import Field, KeyLayout, mixture, owned_keys, positions, text_kind
from pentad.interop.hf.llama import ATTENTION_DROPOUT, BODY_FIELDS, ROPE_KEYS
from pentad.interop.hf.qwen2 import Qwen2Family, qk_norm

DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "layer_types": None, "attention_dropout": 0.0,
}
# config.json's keys in the order they are written (sliding_window and max_window_layers: the imported ones kept)
FIELDS: list[Field] = BODY_FIELDS + [
    Field("attention_bias", write=lambda m: False),
    Field("use_sliding_window", kept=True, write=lambda m: False),
    Field("layer_types", write=lambda m: ["full_attention"] * m.encoder.num_layers),
    ATTENTION_DROPOUT,
]


class Qwen3Family(Qwen2Family):
    name = "qwen3"
    model_types = ("qwen3",)
    narrows = ("llama",)
    layout = KeyLayout(contains=(".self_attn.q_norm.",), also=(".mlp.gate_proj.",), rank=90)

    architecture = "Qwen3ForCausalLM"
    display = "Qwen3"
    defaults = DEFAULTS
    fields = FIELDS
    owned = owned_keys(FIELDS, *ROPE_KEYS)
    attention_bias_key = "attention_bias"
    qk_norm = "before_rotary"
    qk_norm_names = ("q_norm", "k_norm")
    derives_head_dim = False  # Qwen3Config's head_dim defaults to 128, not hidden_size / heads

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and qk_norm(model) == "before_rotary"


FAMILY = Qwen3Family()
