"""Mistral (``model_type: mistral``: ``MistralForCausalLM``, Mistral 7B v0.1-v0.3), both ways.

A LLaMA body (:mod:`pentad.interop.hf.llama`: the same tensor names, fused ``qkv`` from
``q_proj``/``k_proj``/``v_proj``, RMSNorm, SwiGLU, rotary positions, grouped-query heads) with
sliding-window attention in every layer: ``sliding_window`` W (v0.1: 4096) is pentad's
``encoder.sliding_window`` (a query sees itself and the W - 1 positions before it, as transformers'
mask; the key/value cache of generation keeps W - 1 positions); ``null`` (v0.2, v0.3) is global
attention. Mistral has no biases. RoPE scaling converts as for LLaMA. ``layer_types``, which
``MistralForCausalLM`` ignores (every layer uses the window), is kept in config.json and ignored here
too. A model whose layers alternate local and global attention (``window_pattern``) or rotate local
layers at a base of their own is refused (Gemma 3's traits).

Export: a pentad model with a sliding window in every layer is described by this family (without a
window it is a LLaMA); one imported from a Mistral checkpoint without a window exports as Mistral again.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    ImportPlan,
    activation,
    activation_name,
    export_fields,
    hinted_problems,
    merge_config,
    mixture,
    owned_keys,
    positions,
    seq_length,
    text_kind,
    window_problems,
    windowed,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY_FIELDS,
    ROPE_KEYS,
    LlamaFamily,
    body_model,
    body_problems,
    dynamic_positions,
    rope_export,
    rope_scaling,
    rope_theta,
)

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_dropout": 0.0, "sliding_window": 4096,
}
FIELDS: list[Field] = BODY_FIELDS + [Field("sliding_window", write=lambda m: m.encoder.sliding_window),
                                     ATTENTION_DROPOUT]
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("MistralForCausalLM",)


class MistralFamily(LlamaFamily):
    name = "mistral"
    model_types = ("mistral",)
    layout = LlamaFamily.layout  # LLaMA's tensor names: a layout guess names llama (the first of the two)

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and windowed(model) == "every"

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        window = c["sliding_window"]
        if window is not None and (not isinstance(window, int) or window < 1):
            problems.append(f"sliding_window {window!r} (a positive number of positions, or null)")
        heads = int(c["num_attention_heads"])
        max_positions = int(c["max_position_embeddings"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        scaling = rope_scaling(config, max_positions, seq_length(max_length, max_positions), head_dim, problems)
        if problems:
            raise UserError(f"cannot convert {label} (mistral): " + "; ".join(problems) + ".")
        tied = bool(c["tie_word_embeddings"])
        options: dict[str, Any] = {} if window is None else {"sliding_window": int(window)}
        model = body_model(c, act, rope_theta(config), max_length, tied, ffn="gated", bias=False, **options)
        if scaling is not None:
            model["encoder"]["rope_scaling"] = scaling
        rules = self.rules(prefix="model.", num_layers=int(c["num_hidden_layers"]), heads=heads,
                           kv_heads=int(c["num_key_value_heads"] or heads), attention_bias=False, mlp_bias=False,
                           head="tied" if tied else "untied", lm="lm")
        notes = []
        if "layer_types" in config:
            notes.append("layer_types is ignored, as MistralForCausalLM ignores it: every layer uses sliding_window")
        return ImportPlan(model, rules, "MistralForCausalLM", [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        window = getattr(enc, "sliding_window", None)
        problems = body_problems(model, "mistral", "Mistral", scaling=True, ffn="gated", bias=False,
                                 sliding_window=window, window_pattern=getattr(enc, "window_pattern", None),
                                 rotary_local_base=None)
        if enc.type == "transformer":
            problems += window_problems(enc, "Mistral")
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as mistral: " + "; ".join(problems) + ".")
        heads = enc.num_heads
        config: dict[str, Any] = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                  **export_fields(FIELDS, model, hidden_act=act), **rope_export(enc, base)}
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if dynamic_positions(enc, model.max_seq_length) is not None:
            config["max_position_embeddings"] = dynamic_positions(enc, model.max_seq_length)
        for key, value in (("bos_token_id", None), ("eos_token_id", eos_id)):
            if key not in base and value is not None:
                config[key] = value
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           attention_bias=False, mlp_bias=False,
                           head="tied" if model.tie_word_embeddings else "untied", lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "MistralForCausalLM", set(), [])


FAMILY = MistralFamily()
