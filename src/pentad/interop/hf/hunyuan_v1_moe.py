"""HunYuan MoE (``model_type: hunyuan_v1_moe``: ``HunYuanMoEV1ForCausalLM``, Hunyuan-A13B), both ways.

HunYuan dense's attention (:mod:`pentad.interop.hf.hunyuan_v1_dense`: per-head RMSNorm on queries
and keys after the rotary rotation, ``qk_norm: after_rotary``; its NTK-alpha RoPE as a rotary base)
with a mixture of experts in every layer: pentad ``ffn: moe`` with

* ``mlp.gate.wg.weight`` [N, H] -> ``ffn.router.weight``: softmax over ``num_experts``, top
  ``moe_topk``, always renormalised over the k (``normalize: true``);
* ``mlp.experts.E.gate_proj`` / ``up_proj`` [F, H], ``down_proj`` [H, F] (F = ``intermediate_size``)
  -> stacked ``ffn.experts.gate`` / ``up`` / ``down`` (``expert_ffn_size`` F);
* ``mlp.shared_mlp.*``, a SwiGLU of the same width F every token passes through, ungated
  (``shared_experts: 1``, ``shared_gate: false``) -> ``ffn.shared.*``.

``num_experts`` and ``moe_topk`` may be lists (one value per layer): lists whose values are all equal
convert, others are refused. transformers' config has no load-balancing weight: pentad's
``balance_loss_weight`` keeps its default on import and is not written on export. ``attention_bias``
true is refused, as for the dense family.
"""

from __future__ import annotations

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
    merge_config,
    mixture,
    owned_keys,
    positions,
    shared_expert_gate,
    text_kind,
)
from pentad.interop.hf.hunyuan_v1_dense import hunyuan_rotary, hunyuan_rotary_export
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    BODY_FIELDS,
    HEADS,
    NORMS,
    OUT,
    QKV,
    ROPE_KEYS,
    LlamaFamily,
    body_model,
    body_problems,
    dynamic_positions,
)
from pentad.interop.hf.qwen2 import qk_norm
from pentad.interop.hf.qwen2_moe import EXPERTS
from pentad.interop.keymap import Rule, RuleSpec, expand

LAYER: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.q_norm.weight", "{p}layers.{layer}.self_attn.query_layernorm.weight"),
    ("encoder.layers.{layer}.attention.k_norm.weight", "{p}layers.{layer}.self_attn.key_layernorm.weight"),
    ("encoder.layers.{layer}.ffn.router.weight", "{p}layers.{layer}.mlp.gate.wg.weight"),
    ("encoder.layers.{layer}.ffn.shared.gate.weight", "{p}layers.{layer}.mlp.shared_mlp.gate_proj.weight"),
    ("encoder.layers.{layer}.ffn.shared.up.weight", "{p}layers.{layer}.mlp.shared_mlp.up_proj.weight"),
    ("encoder.layers.{layer}.ffn.shared.down.weight", "{p}layers.{layer}.mlp.shared_mlp.down_proj.weight"),
]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "num_experts": 1, "moe_topk": 1, "head_dim": None,
}


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


# config.json's keys in the order they are written; intermediate_size is the experts' (and the shared one's) width
FIELDS: list[Field] = BODY_FIELDS + [
    Field("attention_bias", write=lambda m: False),
    ATTENTION_DROPOUT,
    Field("num_experts", write=lambda m: _moe(m).num_experts),
    Field("moe_topk", write=lambda m: _moe(m).top_k),
    Field("output_router_logits", write=lambda m: False),
]
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("HunYuanMoEV1ForCausalLM",)


def one_value(c: dict[str, Any], key: str, layers: int, problems: list[str]) -> int:
    """A per-model value of config.json that may be a per-layer list (all equal, else a problem)."""
    value = c[key]
    if isinstance(value, list):
        if len(value) != layers or len(set(value)) != 1:
            problems.append(f"{key} {value} (pentad gives every layer the same mixture: one value for "
                            f"{layers} layers)")
            return int(value[0]) if value else 1
        return int(value[0])
    return int(value)


class HunYuanMoeFamily(LlamaFamily):
    name = "hunyuan_v1_moe"
    model_types = ("hunyuan_v1_moe",)
    narrows = ("mixtral",)
    layout = KeyLayout(contains=(".mlp.gate.wg.",), rank=40)
    tokenizer_kind = "tokenizer_json"
    tokenizer_class = "PreTrainedTokenizerFast"
    default_special_tokens: dict[str, str] = {}

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and mixture(model) \
            and qk_norm(model) == "after_rotary" and not shared_expert_gate(model)

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int,  # type: ignore[override]
              experts: int, head: str, lm: str) -> list[Rule]:
        stacked: list[RuleSpec] = [
            (f"encoder.layers.{{layer}}.ffn.experts.{ours}",
             tuple(f"{{p}}layers.{{layer}}.mlp.experts.{e}.{ours}_proj.weight" for e in range(experts)),
             "stack_experts")
            for ours in EXPERTS]
        return expand(BODY + HEADS[head] + QKV + OUT + NORMS + LAYER + stacked, p=prefix, layer=range(num_layers),
                      heads=heads, kv_heads=kv_heads, lm=lm, awb=("weight",))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        if c["attention_bias"]:
            problems.append("attention_bias true (biases on the query, key, value and output projections but not "
                            "the feed-forward, which pentad's one bias switch cannot hold)")
        layers = int(c["num_hidden_layers"])
        experts = one_value(c, "num_experts", layers, problems)
        top_k = one_value(c, "moe_topk", layers, problems)
        if experts < 2:
            problems.append(f"num_experts {experts} (pentad's mixture of experts has at least two)")
        heads = int(c["num_attention_heads"])
        if c.get("head_dim") is None:
            problems.append("head_dim null (transformers' HunYuan attention needs it set)")
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        base, scaling = hunyuan_rotary(config, c, head_dim, max_length, problems)
        if problems:
            raise UserError(f"cannot convert {label} (hunyuan_v1_moe): " + "; ".join(problems) + ".")
        kv_heads = int(c["num_key_value_heads"] or heads)
        moe = {"num_experts": experts, "top_k": top_k, "expert": "gated", "normalize": True, "shared_experts": 1,
               "expert_ffn_size": int(c["intermediate_size"])}
        tied = bool(c["tie_word_embeddings"])
        model = body_model(c, act, base, max_length, tied, ffn="moe", bias=False, moe=moe, qk_norm="after_rotary")
        if scaling is not None:
            model["encoder"]["rope_scaling"] = scaling
        rules = self.rules(prefix="model.", num_layers=layers, heads=heads, kv_heads=kv_heads, experts=experts,
                           head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, "HunYuanMoEV1ForCausalLM", [], [])

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = body_problems(model, "hunyuan_v1_moe", "HunYuan MoE", scaling=True, ffn="moe", bias=False,
                                 qk_norm="after_rotary")
        if enc.type == "transformer":
            moe = enc.moe_config
            want = {"routing": "top_k", "expert": "gated", "normalize": True, "capacity_factor": None,
                    "router_input": "hidden", "every": 1, "shared_experts": 1}
            problems += [f"model.encoder.moe.{k} is {getattr(moe, k)!r} where hunyuan_v1_moe has {v!r}"
                         for k, v in want.items() if getattr(moe, k) != v]
            if moe.first not in (None, 0):
                problems.append(f"model.encoder.moe.first is {moe.first} where hunyuan_v1_moe has experts in every "
                                "layer")
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as hunyuan_v1_moe: " + "; ".join(problems) + ".")
        moe = enc.moe_config
        width = moe.expert_ffn_size or enc.ffn_size or 4 * model.hidden_size
        config: dict[str, Any] = {"architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe",
                                  **export_fields(FIELDS, model, hidden_act=act, intermediate_size=width),
                                  **hunyuan_rotary_export(model, base)}
        for key in ("num_experts", "moe_topk"):  # a per-layer list stays a list
            if isinstance(base.get(key), list) and len(base[key]) == enc.num_layers:
                config[key] = [config[key]] * enc.num_layers
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if dynamic_positions(enc, model.max_seq_length) is not None:
            config["max_position_embeddings"] = dynamic_positions(enc, model.max_seq_length)
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        heads = enc.num_heads
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           experts=moe.num_experts, head="tied" if model.tie_word_embeddings else "untied",
                           lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "HunYuanMoEV1ForCausalLM", set(), [])


FAMILY = HunYuanMoeFamily()
