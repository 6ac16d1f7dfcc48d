"""Mixtral (``model_type: mixtral``: ``MixtralForCausalLM``), both ways.

A LLaMA body (:mod:`pentad.interop.hf.llama`: fused ``qkv`` from ``q_proj``/``k_proj``/``v_proj``,
RMSNorm, rotary positions) whose feed-forwards are sparse mixtures of SwiGLU experts: pentad
``ffn: moe`` with ``moe: {num_experts: num_local_experts, top_k: num_experts_per_tok, expert: gated,
normalize: true}`` and no capacity (dropless), as Mixtral routes. Keys, in the layout every
published Mixtral checkpoint has (and transformers 5 writes back on ``save_pretrained``):

* ``block_sparse_moe.gate.weight`` [N, H] -> ``ffn.router.weight``;
* ``block_sparse_moe.experts.E.w1`` (gate), ``w3`` (up) [F, H] and ``w2`` (down) [H, F] for each
  expert E -> stacked ``ffn.experts.gate``, ``ffn.experts.up`` [N, F, H] and ``ffn.experts.down``
  [N, H, F] (transform ``stack_experts``).

``router_aux_loss_coef`` weighs a load-balancing loss that sums its token fractions over the k
choices, k times pentad's (whose fractions are over assignments): pentad's ``balance_loss_weight``
is ``router_aux_loss_coef * num_experts_per_tok``. ``router_jitter_noise`` (training-time input
noise) has no pentad counterpart (a note says so). ``sliding_window`` (null in the published
checkpoints) is pentad's ``encoder.sliding_window``, in every layer, as for Mistral.
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
    window_problems,
    with_rows,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    BODY_FIELDS,
    HEADS,
    ROPE_KEYS,
    LlamaFamily,
    body_model,
    body_problems,
    rope,
    rope_and_tokens,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

ATTENTION: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.qkv.weight",
     ("{p}layers.{layer}.self_attn.q_proj.weight", "{p}layers.{layer}.self_attn.k_proj.weight",
      "{p}layers.{layer}.self_attn.v_proj.weight"), "fuse_qkv:{heads}:{kv_heads}"),
    ("encoder.layers.{layer}.attention.out.weight", "{p}layers.{layer}.self_attn.o_proj.weight"),
    ("encoder.layers.{layer}.attention_norm.weight", "{p}layers.{layer}.input_layernorm.weight"),
    ("encoder.layers.{layer}.ffn.router.weight", "{p}layers.{layer}.block_sparse_moe.gate.weight"),
    ("encoder.layers.{layer}.ffn_norm.weight", "{p}layers.{layer}.post_attention_layernorm.weight"),
]
EXPERTS = (("gate", "w1"), ("up", "w3"), ("down", "w2"))

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "initializer_range": 0.02, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "attention_dropout": 0.0, "num_experts_per_tok": 2, "num_local_experts": 8,
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": None,
}


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


# config.json's keys in the order they are written: LLaMA's body with the experts' width and the head
# width as given (None: H / heads), then the mixture's
FIELDS: list[Field] = with_rows(
    BODY_FIELDS,
    Field("intermediate_size", "encoder.ffn_size", int,
          lambda m: _moe(m).expert_ffn_size or m.encoder.ffn_size or 4 * m.hidden_size),
    Field("head_dim", write=lambda m: m.encoder.head_size),
    ATTENTION_DROPOUT,
    Field("num_local_experts", write=lambda m: _moe(m).num_experts),
    Field("num_experts_per_tok", write=lambda m: _moe(m).top_k),
    Field("router_aux_loss_coef", write=lambda m: _moe(m).balance_loss_weight / _moe(m).top_k),
    Field("router_jitter_noise", write=lambda m: 0.0),
    Field("output_router_logits", write=lambda m: False),
    Field("sliding_window", write=lambda m: m.encoder.sliding_window),
)
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("MixtralForCausalLM",)


class MixtralFamily(LlamaFamily):
    name = "mixtral"
    model_types = ("mixtral",)
    layout = KeyLayout(contains=(".block_sparse_moe.",))

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and mixture(model) \
            and not shared_expert_gate(model)

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int, experts: int,  # type: ignore[override]
              head: str, lm: str) -> list[Rule]:
        stacked: list[RuleSpec] = [
            (f"encoder.layers.{{layer}}.ffn.experts.{ours}",
             tuple(f"{{p}}layers.{{layer}}.block_sparse_moe.experts.{e}.{theirs}.weight" for e in range(experts)),
             "stack_experts")
            for ours, theirs in EXPERTS]
        return expand(BODY + ATTENTION + stacked + HEADS[head], p=prefix, layer=range(num_layers), heads=heads,
                      kv_heads=kv_heads, lm=lm)

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        base = rope(config, problems)
        window = c["sliding_window"]
        if window is not None and (not isinstance(window, int) or window < 1):
            problems.append(f"sliding_window {window!r} (a positive number of positions, or null)")
        if problems:
            raise UserError(f"cannot convert {label} (mixtral): " + "; ".join(problems) + ".")
        heads = int(c["num_attention_heads"])
        kv_heads = int(c["num_key_value_heads"] or heads)
        experts, top_k = int(c["num_local_experts"]), int(c["num_experts_per_tok"])
        tied = bool(c["tie_word_embeddings"])
        moe = {"num_experts": experts, "top_k": top_k, "expert": "gated", "normalize": True,
               "balance_loss_weight": float(c["router_aux_loss_coef"]) * top_k}
        window = {} if c["sliding_window"] is None else {"sliding_window": int(c["sliding_window"])}
        model = body_model(c, act, base, max_length, tied, ffn="moe", bias=False, moe=moe, **window)
        rules = self.rules(prefix="model.", num_layers=int(c["num_hidden_layers"]), heads=heads, kv_heads=kv_heads,
                           experts=experts, head="tied" if tied else "untied", lm="lm")
        notes = []
        if float(c["router_jitter_noise"]):
            notes.append(f"router_jitter_noise {c['router_jitter_noise']} (training-time noise on the router input) "
                         "is not reproduced")
        return ImportPlan(model, rules, "MixtralForCausalLM", [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = body_problems(model, "mixtral", "Mixtral", ffn="moe", bias=False,
                                 sliding_window=getattr(enc, "sliding_window", None),
                                 window_pattern=getattr(enc, "window_pattern", None))
        if enc.type == "transformer":
            problems += window_problems(enc, "Mixtral")
            moe = enc.moe_config
            want = {"routing": "top_k", "expert": "gated", "normalize": True, "capacity_factor": None,
                    "router_input": "hidden", "every": 1, "shared_experts": 0}
            problems += [f"model.encoder.moe.{k} is {getattr(moe, k)!r} where mixtral has {v!r}"
                         for k, v in want.items() if getattr(moe, k) != v]
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as mixtral: " + "; ".join(problems) + ".")
        heads = enc.num_heads
        moe = enc.moe_config
        config: dict[str, Any] = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                                  **export_fields(FIELDS, model, hidden_act=act)}
        rope_and_tokens(config, base, model, eos_id)
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads, kv_heads=enc.num_kv_heads or heads,
                           experts=moe.num_experts, head="tied" if model.tie_word_embeddings else "untied",
                           lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "MixtralForCausalLM", set(), [])


FAMILY = MixtralFamily()
