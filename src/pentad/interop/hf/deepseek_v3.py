"""DeepSeek-V3 (``model_type: deepseek_v3``: ``DeepseekV3ForCausalLM``, DeepSeek-V3 and R1), both ways.

A pre-RMSNorm causal stack with rotary positions whose attention is multi-head latent attention (pentad
``latent_attention``, ``components/attention/latent.py``) and whose feed-forwards are, after
``first_k_dense_replace`` dense SwiGLUs of ``intermediate_size``, DeepSeek mixtures of experts (pentad
``ffn: moe`` with ``scoring: sigmoid``, ``choice_bias``, ``groups``, ``routed_scaling``, ``first``). Keys:

* ``self_attn.q_a_proj`` -> ``attention.q_down``, ``q_a_layernorm`` -> ``q_norm``, ``q_b_proj`` -> ``q_up``
  (``q_lora_rank`` null: ``q_proj`` -> ``q``); ``kv_a_proj_with_mqa`` -> ``kv_down``, ``kv_a_layernorm`` ->
  ``kv_norm``; ``kv_b_proj`` (per head: keys, then values) -> ``kv_up`` (every head's keys, then every head's
  values: transform ``head_parts``); ``o_proj`` -> ``out``. With ``rope_interleave`` (transformers' default,
  the layout of DeepSeek's checkpoints) the rotary rows of each query head and of the shared rotary key pair
  dimensions (2i, 2i+1); they are moved to the rotate-half layout pentad rotates (transform ``rope_rows``),
  and back on export;
* ``mlp.gate.weight`` -> ``ffn.router.weight``, ``mlp.gate.e_score_correction_bias`` -> ``ffn.expert_bias``
  (the choice bias, fp32), ``mlp.experts.E.{gate,up,down}_proj`` -> stacked ``ffn.experts.*``,
  ``mlp.shared_experts.*`` -> ``ffn.shared.*`` (``n_shared_experts`` experts wide).

``rope_theta`` and the RoPE parameters (YaRN for DeepSeek-V3, with ``mscale_all_dim``, which also scales the
softmax) read as for LLaMA (:mod:`pentad.interop.hf.llama`). transformers has no load-balancing loss for this
architecture: the import sets ``balance_loss_weight: 0`` and leaves the bias fixed (``bias_update_rate: 0``);
both are training options, which the export leaves out (a note says so). Refused by name: query/key/value
biases (``attention_bias``), ``num_key_value_heads`` other than ``num_attention_heads``, no shared expert,
a ``scoring_func``, ``topk_method`` or ``moe_layer_freq`` other than what transformers computes, fp8
weights (``quantization_config``), and multi-token-prediction layers (``model.layers.N`` for N >=
``num_hidden_layers``: pentad builds no multi-token-prediction heads).
"""

from __future__ import annotations

import re
from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    ImportPlan,
    KeyLayout,
    activation,
    activation_name,
    export_fields,
    hinted_problems,
    import_fields,
    merge_config,
    owned_keys,
    positions,
    seq_length,
    text_kind,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    HEADS,
    MLP,
    NORMS,
    ROPE_KEYS,
    LlamaFamily,
    body_problems,
    rope_export,
    rope_scaling,
    rope_theta,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

ARCHITECTURE = "DeepseekV3ForCausalLM"
DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": None, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 4096, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_interleave": True, "attention_bias": False, "attention_dropout": 0.0,
}
LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm and kv_a_layernorm with their default eps
# what the original DeepSeek-V3 config.json says and transformers takes for granted
COMPUTED = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


def _latent(key: str, read: Any = int) -> Field:
    return Field(key, f"encoder.latent_attention.{key}", read)


# config.json <-> pentad in the order config.json is written; the mixture's rows (MIXTURE) only for a model
# that has one (an all-dense model keeps its config.json's); the activation, the first sparse layer, the RoPE
# keys and rope_interleave are computed
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("hidden_size", "hidden_size", int),
    Field("intermediate_size", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("num_hidden_layers", "encoder.num_layers", int),
    Field("num_attention_heads", "encoder.num_heads", int),
    Field("num_key_value_heads", write=lambda m: m.encoder.num_heads),
    _latent("kv_lora_rank"),
    _latent("q_lora_rank", lambda value: None if value is None else int(value)),
    _latent("qk_rope_head_dim"),
    _latent("v_head_dim"),
    _latent("qk_nope_head_dim"),
    Field("first_k_dense_replace"),
    Field("hidden_act"),
    Field("max_position_embeddings", write=lambda m: m.max_seq_length),
    Field("initializer_range", "init_std", float),
    Field("rms_norm_eps", "encoder.layer_norm_eps", float),
    Field("tie_word_embeddings", write=lambda m: m.tie_word_embeddings),
    Field("rope_interleave"),
    Field("attention_bias", write=lambda m: False),
    ATTENTION_DROPOUT,
]
MIXTURE: list[Field] = [
    Field("moe_intermediate_size",
          write=lambda m: _moe(m).expert_ffn_size or m.encoder.ffn_size or 4 * m.hidden_size),
    Field("n_shared_experts", write=lambda m: _moe(m).shared_experts),
    Field("n_routed_experts", write=lambda m: _moe(m).num_experts),
    Field("routed_scaling_factor", write=lambda m: _moe(m).routed_scaling),
    Field("n_group", write=lambda m: _moe(m).groups),
    Field("topk_group", write=lambda m: _moe(m).group_top_k or _moe(m).groups),
    Field("num_experts_per_tok", write=lambda m: _moe(m).top_k),
    Field("norm_topk_prob", write=lambda m: _moe(m).normalize),
]
OWNED = owned_keys(FIELDS + MIXTURE, "num_nextn_predict_layers", *ROPE_KEYS)
DENSE_OWNED = owned_keys(FIELDS, "num_nextn_predict_layers", *ROPE_KEYS)

ATTENTION: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.kv_down.weight", "{p}layers.{layer}.self_attn.kv_a_proj_with_mqa.weight",
     "{kv_rope}"),
    ("encoder.layers.{layer}.attention.kv_norm.weight", "{p}layers.{layer}.self_attn.kv_a_layernorm.weight"),
    ("encoder.layers.{layer}.attention.kv_up.weight", "{p}layers.{layer}.self_attn.kv_b_proj.weight",
     "head_parts:{heads}:{nope}:{v}"),
    ("encoder.layers.{layer}.attention.out.weight", "{p}layers.{layer}.self_attn.o_proj.weight"),
]
QUERY: dict[bool, list[RuleSpec]] = {
    False: [("encoder.layers.{layer}.attention.q.weight", "{p}layers.{layer}.self_attn.q_proj.weight", "{q_rope}")],
    True: [("encoder.layers.{layer}.attention.q_down.weight", "{p}layers.{layer}.self_attn.q_a_proj.weight"),
           ("encoder.layers.{layer}.attention.q_norm.weight", "{p}layers.{layer}.self_attn.q_a_layernorm.weight"),
           ("encoder.layers.{layer}.attention.q_up.weight", "{p}layers.{layer}.self_attn.q_b_proj.weight",
            "{q_rope}")],
}
SPARSE: list[RuleSpec] = [
    ("encoder.layers.{layer}.ffn.router.weight", "{p}layers.{layer}.mlp.gate.weight"),
    ("encoder.layers.{layer}.ffn.expert_bias", "{p}layers.{layer}.mlp.gate.e_score_correction_bias"),
    *[(f"encoder.layers.{{layer}}.ffn.shared.{ours}.weight",
       f"{{p}}layers.{{layer}}.mlp.shared_experts.{ours}_proj.weight") for ours in ("gate", "up", "down")],
]


def _sizes(c: dict[str, Any]) -> dict[str, int]:
    return {"heads": int(c["num_attention_heads"]), "rank": int(c["kv_lora_rank"]), "nope": int(c["qk_nope_head_dim"]),
            "rope": int(c["qk_rope_head_dim"]), "v": int(c["v_head_dim"])}


class DeepseekV3Family(LlamaFamily):
    name = "deepseek_v3"
    model_types = ("deepseek_v3",)
    layout = KeyLayout(contains=(".self_attn.kv_a_proj_with_mqa.",), rank=50)
    tokenizer_kind = "tokenizer_json"  # byte-level BPE in tokenizer.json (LlamaTokenizerFast): the file as it is
    tokenizer_class = "LlamaTokenizerFast"
    default_special_tokens = {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"}

    # a rotary causal stack with latent attention is DeepSeek's, whatever its feed-forwards: LLaMA (dense),
    # Mixtral and Qwen2-MoE (mixtures) would accept it and then refuse the latent projections
    narrows = ("llama", "mixtral", "qwen2_moe")

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" \
            and getattr(model.encoder, "latent_attention", None) is not None

    def rules(self, *, prefix: str, num_layers: int, sizes: dict[str, int],  # type: ignore[override]
              lora_queries: bool, interleave: bool, experts: int, first_sparse: int, head: str, lm: str) -> list[Rule]:
        heads, nope, rope, rank = sizes["heads"], sizes["nope"], sizes["rope"], sizes["rank"]
        common = dict(p=prefix, lm=lm, heads=heads, nope=nope, v=sizes["v"],
                      q_rope=f"rope_rows:{heads}:{nope}:{rope}" if interleave else "copy",
                      kv_rope=f"rope_rows:1:{rank}:{rope}" if interleave else "copy")
        stacked: list[RuleSpec] = [
            (f"encoder.layers.{{layer}}.ffn.experts.{ours}",
             tuple(f"{{p}}layers.{{layer}}.mlp.experts.{e}.{ours}_proj.weight" for e in range(experts)),
             "stack_experts") for ours in ("gate", "up", "down")]
        layers, sparse = range(num_layers), range(first_sparse, num_layers)
        return (expand(BODY + HEADS[head], **common)
                + expand(QUERY[lora_queries] + ATTENTION + NORMS, layer=layers, **common)
                + expand(MLP, layer=range(min(first_sparse, num_layers)), mwb=("weight",), **common)
                + expand(SPARSE + stacked, layer=sparse, **common))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, (ARCHITECTURE,))
        act = activation(c["hidden_act"], problems)
        layers, sizes = int(c["num_hidden_layers"]), _sizes(c)
        heads = sizes["heads"]
        if c["attention_bias"]:
            problems.append("attention_bias true (biases on q_a_proj, kv_a_proj_with_mqa and o_proj alone, while the "
                            "feed-forwards have none: pentad has one bias switch for both)")
        if int(c["num_key_value_heads"] or heads) != heads:
            problems.append(f"num_key_value_heads {c['num_key_value_heads']} with num_attention_heads {heads} (latent "
                            "attention expands keys and values for every head)")
        for key, value in COMPUTED.items():
            if key in config and config[key] != value:
                problems.append(f"{key} {config[key]!r} (transformers' DeepseekV3 computes {value!r} whatever it says, "
                                "and so does pentad)")
        if config.get("quantization_config"):
            method = config["quantization_config"].get("quant_method", "?") if isinstance(
                config["quantization_config"], dict) else "?"
            problems.append(f"quantization_config ({method}: quantised weights with their scales); convert a "
                            "dequantised bf16 or fp32 checkpoint")
        extra = sorted({m.group(1) for k in keys if (m := re.match(r"(?:model\.)?layers\.(\d+)\.", k))
                        and int(m.group(1)) >= layers}, key=int)
        if extra:
            problems.append(f"multi-token-prediction layer(s) model.layers.{', '.join(extra)} "
                            f"(num_nextn_predict_layers {c.get('num_nextn_predict_layers', 0)}): pentad has no "
                            "multi-token-prediction heads; "
                            "drop those tensors to convert the main model, which is what transformers runs")
        first = min(int(c["first_k_dense_replace"]), layers)
        experts = int(c["n_routed_experts"]) if first < layers else 0
        if experts and int(c["n_shared_experts"] or 0) < 1:
            problems.append(f"n_shared_experts {c['n_shared_experts']} (pentad's DeepSeek mixture has shared experts)")
        max_positions = int(c["max_position_embeddings"])
        max_seq = seq_length(max_length, max_positions)
        scaling = rope_scaling(config, max_positions, max_seq, sizes["rope"], problems)
        if problems:
            raise UserError(f"cannot convert {label} (deepseek_v3): " + "; ".join(problems) + ".")
        tied = bool(c["tie_word_embeddings"])
        model = import_fields(FIELDS, c, {
            "max_seq_length": max_seq, "tie_word_embeddings": tied,
            "embedding": {"parts": [{"type": "word"}], "norm": False, "dropout": 0.0},
            "encoder": {"type": "transformer", "ffn": "moe" if experts else "gated", "activation": act,
                        "norm": "rmsnorm", "norm_position": "pre", "final_norm": True, "mask": "causal",
                        "dropout": 0.0, "bias": False, "positions": "rotary", "rotary_base": rope_theta(config),
                        "latent_attention": {"norm_eps": LATENT_NORM_EPS}},
            "targets": [{"type": "lm"}]})
        encoder = model["encoder"]
        if scaling is not None:
            encoder["rope_scaling"] = scaling
        if experts:
            top_k, groups = int(c["num_experts_per_tok"]), int(c["n_group"] or 1)
            encoder["moe"] = {
                "num_experts": experts, "top_k": top_k, "expert": "gated",
                "expert_ffn_size": int(c["moe_intermediate_size"]), "normalize": bool(c["norm_topk_prob"]),
                "every": 1, "first": first, "shared_experts": int(c["n_shared_experts"]), "balance_loss_weight": 0.0,
                "scoring": "sigmoid", "choice_bias": True, "groups": groups,
                "group_top_k": int(c["topk_group"] or groups), "routed_scaling": float(c["routed_scaling_factor"])}
        rules = self.rules(prefix="model.", num_layers=layers, sizes=sizes, lora_queries=c["q_lora_rank"] is not None,
                           interleave=bool(c["rope_interleave"]), experts=experts, first_sparse=first,
                           head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, ARCHITECTURE, [], [])

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        sparse = getattr(enc, "ffn", None) == "moe"
        problems = body_problems(model, "deepseek_v3", "DeepSeek-V3", scaling=True, ffn="moe" if sparse else "gated",
                                 bias=False)
        latent = getattr(enc, "latent_attention", None)
        notes: list[str] = []
        if latent is None:
            problems.append("model.encoder.latent_attention is unset where deepseek_v3 has multi-head latent attention")
        elif latent.norm_eps != LATENT_NORM_EPS:
            problems.append(f"model.encoder.latent_attention.norm_eps is {latent.norm_eps} where deepseek_v3 has "
                            f"{LATENT_NORM_EPS}")
        moe = enc.moe_config if sparse else None
        if moe is not None:
            want = {"routing": "top_k", "expert": "gated", "capacity_factor": None, "router_input": "hidden",
                    "shared_gate": False, "scoring": "sigmoid", "choice_bias": True, "every": 1}
            problems += [f"model.encoder.moe.{k} is {getattr(moe, k)!r} where deepseek_v3 has {v!r}"
                         for k, v in want.items() if getattr(moe, k) != v]
            if moe.shared_experts < 1:
                problems.append("model.encoder.moe.shared_experts is 0 where deepseek_v3 has shared experts")
            trained = [f"{k} {getattr(moe, k)}" for k in ("balance_loss_weight", "z_loss_weight", "bias_update_rate")
                       if getattr(moe, k)]
            if trained:
                notes.append(f"training options without a transformers counterpart left out: moe {', '.join(trained)}")
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as deepseek_v3: " + "; ".join(problems) + ".")
        assert latent is not None  # a problem above otherwise
        heads, layers = enc.num_heads, enc.num_layers
        first = (moe.first if moe.first is not None else 0) if moe is not None else layers
        table = FIELDS + MIXTURE if moe is not None else FIELDS
        config: dict[str, Any] = {
            "architectures": [ARCHITECTURE], "model_type": "deepseek_v3",
            **export_fields(table, model, base, hidden_act=act, first_k_dense_replace=first,
                            rope_interleave=bool(base.get("rope_interleave", True))),
            **rope_export(enc, base)}
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        config.setdefault("num_nextn_predict_layers", base.get("num_nextn_predict_layers", 0))
        for key, value in (("eos_token_id", eos_id),):
            if key not in base and value is not None:
                config[key] = value
        config = merge_config(base, OWNED if moe is not None else DENSE_OWNED, config)
        sizes = {"heads": heads, "rank": latent.kv_lora_rank, "nope": latent.qk_nope_head_dim,
                 "rope": latent.qk_rope_head_dim, "v": latent.v_head_dim}
        rules = self.rules(prefix="model.", num_layers=layers, sizes=sizes, lora_queries=latent.q_lora_rank is not None,
                           interleave=config["rope_interleave"], experts=moe.num_experts if moe is not None else 0,
                           first_sparse=first, head="tied" if model.tie_word_embeddings else "untied",
                           lm=model.targets[0].target_name)
        return ExportPlan(config, rules, ARCHITECTURE, set(), notes)


FAMILY = DeepseekV3Family()
