"""Qwen3-MoE (``model_type: qwen3_moe``: ``Qwen3MoeForCausalLM``, Qwen3-30B-A3B, Qwen3-235B-A22B), both ways.

Qwen3's attention (:mod:`pentad.interop.hf.qwen3`: no biases, per-head RMSNorm on queries and keys
before the rotary rotation, pentad ``qk_norm: before_rotary``) with Qwen2-MoE's layer placement
(:mod:`pentad.interop.hf.qwen2_moe`: layer i is sparse when it is not in ``mlp_only_layers`` and
(i + 1) % ``decoder_sparse_step`` is 0; the others are dense SwiGLUs of ``intermediate_size``) and
no shared expert: pentad ``ffn: moe`` with

* ``mlp.gate.weight`` [N, H] -> ``ffn.router.weight``: softmax over ``num_experts`` (transformers
  writes it ``num_local_experts``; the spelling of the imported config.json is kept), top
  ``num_experts_per_tok``, renormalised over the k when ``norm_topk_prob`` (``normalize``);
* ``mlp.experts.E.gate_proj`` / ``up_proj`` [F, H], ``down_proj`` [H, F] (F = ``moe_intermediate_size``,
  ``expert_ffn_size``) -> stacked ``ffn.experts.gate`` / ``up`` / ``down``.

``router_aux_loss_coef`` × ``num_experts_per_tok`` is ``balance_loss_weight`` (as Mixtral's). RoPE
scaling converts as for LLaMA. Refused: ``use_sliding_window`` with a window, ``attention_bias`` true,
a set of sparse layers that is not every k-th from some layer, and a model without sparse layers.
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
    seq_length,
    shared_expert_gate,
    text_kind,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    BODY_FIELDS,
    HEADS,
    MLP,
    NORMS,
    OUT,
    QKV,
    ROPE_KEYS,
    LlamaFamily,
    body_model,
    body_problems,
    dynamic_positions,
    rope_export,
    rope_scaling,
    rope_theta,
)
from pentad.interop.hf.qwen2 import qk_norm
from pentad.interop.hf.qwen2_moe import EXPERTS, pentad_layers, sparse_layers
from pentad.interop.keymap import Rule, RuleSpec, expand

QK_NORMS: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.q_norm.weight", "{p}layers.{layer}.self_attn.q_norm.weight"),
    ("encoder.layers.{layer}.attention.k_norm.weight", "{p}layers.{layer}.self_attn.k_norm.weight"),
]
ROUTER: list[RuleSpec] = [("encoder.layers.{layer}.ffn.router.weight", "{p}layers.{layer}.mlp.gate.weight")]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
    "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": None,
}
EXPERT_KEYS = ("num_experts", "num_local_experts")  # config.json's spellings of the expert count


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


# config.json's keys in the order they are written (the sparse layers' spelling is computed by the export)
FIELDS: list[Field] = BODY_FIELDS + [
    Field("attention_bias", write=lambda m: False),
    Field("use_sliding_window", kept=True, write=lambda m: False),
    ATTENTION_DROPOUT,
    Field("decoder_sparse_step"),
    Field("mlp_only_layers"),
    Field("moe_intermediate_size", write=lambda m: _moe(m).expert_ffn_size or m.encoder.ffn_size or 4 * m.hidden_size),
    Field("num_experts", write=lambda m: _moe(m).num_experts),
    Field("num_experts_per_tok", write=lambda m: _moe(m).top_k),
    Field("norm_topk_prob", write=lambda m: _moe(m).normalize),
    Field("router_aux_loss_coef", write=lambda m: _moe(m).balance_loss_weight / _moe(m).top_k),
    Field("output_router_logits", write=lambda m: False),
]
OWNED = owned_keys(FIELDS, *ROPE_KEYS, *EXPERT_KEYS)
SUPPORTED = ("Qwen3MoeForCausalLM",)


class Qwen3MoeFamily(LlamaFamily):
    name = "qwen3_moe"
    model_types = ("qwen3_moe",)
    narrows = ("mixtral",)
    # query/key norms beside experts (dense layers carry LLaMA's names): tried before Qwen3 and LLaMA
    layout = KeyLayout(contains=(".self_attn.q_norm.",), also=(".mlp.experts.",), rank=40)
    tokenizer_kind = "tokenizer_json"  # byte-level BPE with Qwen's own pre-tokenizer: the file as it is
    tokenizer_class = "Qwen2Tokenizer"
    default_special_tokens = {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and mixture(model) \
            and qk_norm(model) == "before_rotary" and not shared_expert_gate(model)

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int,  # type: ignore[override]
              experts: int, sparse: list[int], head: str, lm: str) -> list[Rule]:
        stacked: list[RuleSpec] = [
            (f"encoder.layers.{{layer}}.ffn.experts.{ours}",
             tuple(f"{{p}}layers.{{layer}}.mlp.experts.{e}.{ours}_proj.weight" for e in range(experts)),
             "stack_experts")
            for ours in EXPERTS]
        dense = [i for i in range(num_layers) if i not in sparse]
        common = dict(p=prefix, heads=heads, kv_heads=kv_heads, lm=lm, awb=("weight",), mwb=("weight",))
        return (expand(BODY + HEADS[head], **common)
                + expand(QKV + OUT + QK_NORMS + NORMS, layer=range(num_layers), **common)
                + expand(MLP, layer=dense, **common)
                + expand(ROUTER + stacked, layer=sparse, **common))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        if c["use_sliding_window"] and c["sliding_window"] is not None:
            problems.append(f"use_sliding_window with sliding_window {c['sliding_window']} (pentad's attention "
                            "is not windowed)")
        if c["attention_bias"]:
            problems.append("attention_bias true (biases on the query, key, value and output projections but not "
                            "the feed-forward, which pentad's one bias switch cannot hold)")
        layers = int(c["num_hidden_layers"])
        experts = int(next((config[k] for k in EXPERT_KEYS if k in config), c["num_experts"]))
        step, mlp_only = int(c["decoder_sparse_step"]), list(c["mlp_only_layers"] or [])
        sparse = sparse_layers(layers, step, mlp_only) if experts > 0 else []
        every, first = 1, 0
        if not sparse:
            problems.append(f"no sparse layer (num_experts {experts}, decoder_sparse_step {step}, mlp_only_layers "
                            f"{mlp_only}): a dense model, which this family does not convert")
        else:
            first = sparse[0]
            every = sparse[1] - sparse[0] if len(sparse) > 1 else layers
            if pentad_layers(layers, every, first) != sparse:
                problems.append(f"sparse layers {sparse} (decoder_sparse_step {step}, mlp_only_layers {mlp_only}): "
                                "pentad places mixtures of experts at first, first + every, ... and cannot express "
                                "this set")
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        max_positions = int(c["max_position_embeddings"])
        scaling = rope_scaling(config, max_positions, seq_length(max_length, max_positions), head_dim, problems)
        if problems:
            raise UserError(f"cannot convert {label} (qwen3_moe): " + "; ".join(problems) + ".")
        kv_heads = int(c["num_key_value_heads"] or heads)
        top_k = int(c["num_experts_per_tok"])
        moe: dict[str, Any] = {
            "num_experts": experts, "top_k": top_k, "expert": "gated",
            "expert_ffn_size": int(c["moe_intermediate_size"]), "normalize": bool(c["norm_topk_prob"]), "every": every,
            "balance_loss_weight": float(c["router_aux_loss_coef"]) * top_k}
        if first != every - 1:
            moe["first"] = first
        tied = bool(c["tie_word_embeddings"])
        model = body_model(c, act, rope_theta(config), max_length, tied, ffn="moe", bias=False, moe=moe,
                           qk_norm="before_rotary")
        if scaling is not None:
            model["encoder"]["rope_scaling"] = scaling
        rules = self.rules(prefix="model.", num_layers=layers, heads=heads, kv_heads=kv_heads, experts=experts,
                           sparse=sparse, head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, "Qwen3MoeForCausalLM", [], [])

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = body_problems(model, "qwen3_moe", "Qwen3-MoE", scaling=True, ffn="moe", bias=False,
                                 qk_norm="before_rotary")
        moe = enc.moe_config if enc.type == "transformer" else None
        if moe is not None:
            want = {"routing": "top_k", "expert": "gated", "capacity_factor": None, "router_input": "hidden",
                    "shared_experts": 0}
            problems += [f"model.encoder.moe.{k} is {getattr(moe, k)!r} where qwen3_moe has {v!r}"
                         for k, v in want.items() if getattr(moe, k) != v]
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as qwen3_moe: " + "; ".join(problems) + ".")
        assert moe is not None
        heads, layers = enc.num_heads, enc.num_layers
        sparse = pentad_layers(layers, moe.every, moe.first)
        step, mlp_only = base.get("decoder_sparse_step", 1), base.get("mlp_only_layers") or []
        if not isinstance(step, int) or step < 1 or sparse_layers(layers, step, list(mlp_only)) != sparse:
            if sparse == pentad_layers(layers, moe.every, None):
                step, mlp_only = moe.every, []
            else:
                step, mlp_only = 1, [i for i in range(layers) if i not in sparse]
        config: dict[str, Any] = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                                  **export_fields(FIELDS, model, hidden_act=act, decoder_sparse_step=step,
                                                  mlp_only_layers=list(mlp_only)),
                                  **rope_export(enc, base)}
        if "num_local_experts" in base and "num_experts" not in base:  # the imported spelling
            config = {("num_local_experts" if k == "num_experts" else k): v for k, v in config.items()}
        if "head_dim" not in base and config["head_dim"] * heads == model.hidden_size:
            del config["head_dim"]  # the config class derives it
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if dynamic_positions(enc, model.max_seq_length) is not None:
            config["max_position_embeddings"] = dynamic_positions(enc, model.max_seq_length)
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", num_layers=layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           experts=moe.num_experts, sparse=sparse,
                           head="tied" if model.tie_word_embeddings else "untied", lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "Qwen3MoeForCausalLM", set(), [])


FAMILY = Qwen3MoeFamily()
