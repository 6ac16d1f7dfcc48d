"""Qwen2-MoE (``model_type: qwen2_moe``: ``Qwen2MoeForCausalLM``, Qwen1.5-MoE, Qwen2-57B-A14B), both ways.

A LLaMA body (:mod:`pentad.interop.hf.llama`: fused ``qkv``, RMSNorm, rotary positions) with
biases on the query/key/value projections alone (``qkv_bias`` -> pentad ``qkv_bias: true`` with
``bias: false``), whose feed-forwards are, layer by layer, either a dense SwiGLU of
``intermediate_size`` (pentad: the stack's ``ffn_size``) or a sparse block (pentad ``ffn: moe``):

* ``mlp.gate.weight`` [N, H] -> ``ffn.router.weight``: softmax over the N experts, top
  ``num_experts_per_tok``, renormalised over the k when ``norm_topk_prob`` (pentad ``normalize``);
* ``mlp.experts.E.gate_proj`` / ``up_proj`` [F, H], ``down_proj`` [H, F] (F = ``moe_intermediate_size``,
  pentad ``expert_ffn_size``) -> stacked ``ffn.experts.gate`` / ``up`` / ``down`` (transformers 5
  fuses gate and up in memory but reads and writes this per-expert layout);
* ``mlp.shared_expert.*`` (a SwiGLU of ``shared_expert_intermediate_size``, a multiple m of F:
  pentad ``shared_experts: m``) -> ``ffn.shared.*``, and ``mlp.shared_expert_gate.weight`` [1, H]
  -> ``ffn.shared_gate.weight`` (``shared_gate: true``: the shared output is scaled by its sigmoid).

Layer i is sparse when it is not in ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` is 0;
pentad places MoE layers at ``first``, ``first + every``, ..., so a set that is not such a
progression is refused. ``router_aux_loss_coef`` is Mixtral's: ``balance_loss_weight`` is it times
``num_experts_per_tok``. Sliding-window attention and RoPE scaling are not converted.
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
    rope,
    rope_and_tokens,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

SPARSE: list[RuleSpec] = [
    ("encoder.layers.{layer}.ffn.router.weight", "{p}layers.{layer}.mlp.gate.weight"),
    ("encoder.layers.{layer}.ffn.shared.gate.weight", "{p}layers.{layer}.mlp.shared_expert.gate_proj.weight"),
    ("encoder.layers.{layer}.ffn.shared.up.weight", "{p}layers.{layer}.mlp.shared_expert.up_proj.weight"),
    ("encoder.layers.{layer}.ffn.shared.down.weight", "{p}layers.{layer}.mlp.shared_expert.down_proj.weight"),
    ("encoder.layers.{layer}.ffn.shared_gate.weight", "{p}layers.{layer}.mlp.shared_expert_gate.weight"),
]
EXPERTS = ("gate", "up", "down")  # pentad's stacked name; HF's is f"{name}_proj"

DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "use_sliding_window": False, "attention_dropout": 0.0, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001, "mlp_only_layers": None, "qkv_bias": True,
}


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


def _expert_size(model: Any) -> int:
    return _moe(model).expert_ffn_size or model.encoder.ffn_size or 4 * model.hidden_size


# config.json's keys in the order they are written: LLaMA's body, then the mixture's (the sparse layers'
# spelling, decoder_sparse_step and mlp_only_layers, is computed by the export)
FIELDS: list[Field] = BODY_FIELDS + [
    Field("use_sliding_window", write=lambda m: False),
    ATTENTION_DROPOUT,
    Field("decoder_sparse_step"),
    Field("mlp_only_layers"),
    Field("moe_intermediate_size", write=_expert_size),
    Field("shared_expert_intermediate_size", write=lambda m: _moe(m).shared_experts * _expert_size(m)),
    Field("num_experts", write=lambda m: _moe(m).num_experts),
    Field("num_experts_per_tok", write=lambda m: _moe(m).top_k),
    Field("norm_topk_prob", write=lambda m: _moe(m).normalize),
    Field("router_aux_loss_coef", write=lambda m: _moe(m).balance_loss_weight / _moe(m).top_k),
    Field("output_router_logits", write=lambda m: False),
    Field("qkv_bias", write=lambda m: bool(m.encoder.qkv_bias)),
]
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("Qwen2MoeForCausalLM",)


def sparse_layers(num_layers: int, step: int, mlp_only: list[int]) -> list[int]:
    """The layers transformers gives a sparse block (``Qwen2MoeDecoderLayer``)."""
    return [i for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0]


def pentad_layers(num_layers: int, every: int, first: int | None) -> list[int]:
    """The layers pentad gives a mixture of experts (``MoEBlock``)."""
    start = every - 1 if first is None else first
    return [i for i in range(num_layers) if i >= start and (i - start) % every == 0]


class Qwen2MoeFamily(LlamaFamily):
    name = "qwen2_moe"
    model_types = ("qwen2_moe",)
    # dense layers (mlp_only_layers) carry LLaMA's names: tried before LLaMA
    layout = KeyLayout(contains=(".mlp.shared_expert_gate.",), rank=50)
    tokenizer_kind = "tokenizer_json"  # byte-level BPE with Qwen's own pre-tokenizer: the file as it is
    tokenizer_class = "Qwen2Tokenizer"
    spm_files = ()
    default_special_tokens = {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and mixture(model) \
            and shared_expert_gate(model)

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int,  # type: ignore[override]
              qkv_bias: bool, experts: int, sparse: list[int], head: str, lm: str) -> list[Rule]:
        stacked: list[RuleSpec] = [
            (f"encoder.layers.{{layer}}.ffn.experts.{ours}",
             tuple(f"{{p}}layers.{{layer}}.mlp.experts.{e}.{ours}_proj.weight" for e in range(experts)),
             "stack_experts")
            for ours in EXPERTS]
        dense = [i for i in range(num_layers) if i not in sparse]
        common = dict(p=prefix, heads=heads, kv_heads=kv_heads, lm=lm)
        return (expand(BODY + HEADS[head], **common)
                + expand(QKV, layer=range(num_layers), awb=("weight", "bias") if qkv_bias else ("weight",), **common)
                + expand(OUT + NORMS, layer=range(num_layers), awb=("weight",), **common)
                + expand(MLP, layer=dense, mwb=("weight",), **common)
                + expand(SPARSE + stacked, layer=sparse, **common))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        base = rope(config, problems)
        if c["use_sliding_window"]:
            problems.append(f"use_sliding_window with sliding_window {c.get('sliding_window')} (pentad's attention "
                            "is not windowed)")
        layers, experts = int(c["num_hidden_layers"]), int(c["num_experts"])
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
        moe_size, shared_size = int(c["moe_intermediate_size"]), int(c["shared_expert_intermediate_size"])
        if shared_size <= 0 or shared_size % moe_size:
            problems.append(f"shared_expert_intermediate_size {shared_size} is not a positive multiple of "
                            f"moe_intermediate_size {moe_size} (pentad's shared expert is shared_experts experts "
                            "wide)")
        if problems:
            raise UserError(f"cannot convert {label} (qwen2_moe): " + "; ".join(problems) + ".")
        heads = int(c["num_attention_heads"])
        kv_heads = int(c["num_key_value_heads"] or heads)
        top_k = int(c["num_experts_per_tok"])
        moe: dict[str, Any] = {
            "num_experts": experts, "top_k": top_k, "expert": "gated", "expert_ffn_size": moe_size,
            "normalize": bool(c["norm_topk_prob"]), "every": every, "shared_experts": shared_size // moe_size,
            "shared_gate": True, "balance_loss_weight": float(c["router_aux_loss_coef"]) * top_k}
        if first != every - 1:
            moe["first"] = first
        tied = bool(c["tie_word_embeddings"])
        model = body_model(c, act, base, max_length, tied, ffn="moe", bias=False, moe=moe,
                           **({"qkv_bias": True} if c["qkv_bias"] else {}))
        rules = self.rules(prefix="model.", num_layers=layers, heads=heads, kv_heads=kv_heads,
                           qkv_bias=bool(c["qkv_bias"]), experts=experts, sparse=sparse,
                           head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, "Qwen2MoeForCausalLM", [], [])

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = body_problems(model, "qwen2_moe", "Qwen2-MoE", ffn="moe", bias=False, qkv_bias=enc.qkv_bias)
        moe = enc.moe_config if enc.type == "transformer" else None
        if moe is not None:
            want = {"routing": "top_k", "expert": "gated", "capacity_factor": None, "router_input": "hidden",
                    "shared_gate": True}
            problems += [f"model.encoder.moe.{k} is {getattr(moe, k)!r} where qwen2_moe has {v!r}"
                         for k, v in want.items() if getattr(moe, k) != v]
            if moe.shared_experts < 1:
                problems.append("model.encoder.moe.shared_experts is 0 where qwen2_moe has a shared expert")
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as qwen2_moe: " + "; ".join(problems) + ".")
        assert moe is not None
        heads, layers = enc.num_heads, enc.num_layers
        sparse = pentad_layers(layers, moe.every, moe.first)
        step, mlp_only = base.get("decoder_sparse_step", 1), base.get("mlp_only_layers") or []
        if not isinstance(step, int) or step < 1 or sparse_layers(layers, step, list(mlp_only)) != sparse:
            # the imported spelling no longer fits (or there is none): the plain one
            if sparse == pentad_layers(layers, moe.every, None):
                step, mlp_only = moe.every, []
            else:
                step, mlp_only = 1, [i for i in range(layers) if i not in sparse]
        config: dict[str, Any] = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                                  **export_fields(FIELDS, model, hidden_act=act, decoder_sparse_step=step,
                                                  mlp_only_layers=list(mlp_only))}
        if "head_dim" not in base and config["head_dim"] * heads == model.hidden_size:
            del config["head_dim"]  # transformers' Qwen2MoeConfig has no head_dim field by default
        rope_and_tokens(config, base, model, eos_id)
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", num_layers=layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           qkv_bias=bool(enc.qkv_bias), experts=moe.num_experts, sparse=sparse,
                           head="tied" if model.tie_word_embeddings else "untied", lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "Qwen2MoeForCausalLM", set(), [])


FAMILY = Qwen2MoeFamily()
