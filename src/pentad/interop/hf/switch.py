"""Switch Transformers (``model_type: switch_transformers``: ``SwitchTransformersForConditionalGeneration``),
both ways.

A T5 v1.0 encoder-decoder (:mod:`pentad.interop.hf.t5`: shared table, T5 norm, no biases, unscaled
attention, relative position bias, the tied output rescaled by d_model^-0.5) whose feed-forwards
are, in every ``num_layers / num_sparse_*_layers``-th layer starting at layer 1, a top-1 mixture of
dense experts: pentad ``ffn: moe`` with ``moe: {num_experts, top_k: 1, expert: dense, normalize:
false, every: step, first: 1}`` (Fedus et al. 2022: the gate is the router probability itself).
Keys as in the published checkpoints: ``...layer.N.mlp.router.classifier.weight`` -> ``ffn.router``,
``...mlp.experts.expert_E.wi`` / ``wo`` stacked into ``ffn.experts.up`` / ``down``; dense layers
``...mlp.wi`` / ``wo``.

Capacity differs: transformers caps each expert at ``expert_capacity`` tokens *per sequence* (padding
included), pentad at a factor of the routed tokens of a batch. The import is dropless (a note says
so; set ``moe.capacity_factor`` to train with dropping), so outputs agree whenever transformers drops
nothing; the export writes the imported ``expert_capacity`` back, else the one its factor gives for
``max_seq_length`` tokens. ``router_jitter_noise`` (training-time input noise) is not reproduced;
``router_z_loss_coef`` and ``router_aux_loss_coef`` are pentad's ``z_loss_weight`` and
``balance_loss_weight`` (the same definitions for top-1).
"""

from __future__ import annotations

import math
from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    HF_ACTIVATIONS,
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    KeyLayout,
    activation_name,
    export_fields,
    hinted_problems,
    import_fields,
    merge_config,
    mixture,
    owned_keys,
    positions,
    seq_length,
    stack_problems,
    text_kind,
)
from pentad.interop.hf.t5 import CROSS_ATTENTION, HEADS, SELF_ATTENTION, SHARED, STACK_END
from pentad.interop.hf.t5 import FIELDS as T5_FIELDS
from pentad.interop.keymap import Rule, RuleSpec, expand

DENSE: list[RuleSpec] = [
    ("{s}.layers.{layer}.ffn.up.weight", "{s}.block.{layer}.layer.{ff}.mlp.wi.weight"),
    ("{s}.layers.{layer}.ffn.down.weight", "{s}.block.{layer}.layer.{ff}.mlp.wo.weight"),
    ("{s}.layers.{layer}.ffn_norm.weight", "{s}.block.{layer}.layer.{ff}.layer_norm.weight"),
]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 2048, "expert_capacity": 64, "num_layers": 12,
    "num_sparse_encoder_layers": 3, "num_decoder_layers": None, "num_sparse_decoder_layers": 3, "num_heads": 12,
    "num_experts": 8, "router_bias": False, "router_jitter_noise": 0.01, "router_dtype": "float32",
    "router_ignore_padding_tokens": False, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "router_z_loss_coef": 0.001, "router_aux_loss_coef": 0.001,
    "dense_act_fn": "relu", "is_encoder_decoder": True, "tie_word_embeddings": True,
}
_T5 = {row.hf: row for row in T5_FIELDS}


def _moe(model: Any) -> Any:
    return model.encoder.moe_config


# config.json <-> pentad in the order config.json is written: T5's rows among the mixture's. Computed by
# the planners: the expert capacity, the sparse layers' counts, the activation, the special token ids.
FIELDS: list[Field] = [
    _T5["vocab_size"], _T5["d_model"], _T5["d_kv"], _T5["d_ff"],
    Field("expert_capacity"),
    _T5["num_layers"],
    Field("num_sparse_encoder_layers"),
    _T5["num_decoder_layers"],
    Field("num_sparse_decoder_layers"),
    _T5["num_heads"],
    Field("num_experts", write=lambda m: _moe(m).num_experts),
    Field("router_bias", write=lambda m: False),
    _T5["relative_attention_num_buckets"], _T5["relative_attention_max_distance"], _T5["dropout_rate"],
    _T5["layer_norm_epsilon"],
    Field("router_z_loss_coef", write=lambda m: _moe(m).z_loss_weight),
    Field("router_aux_loss_coef", write=lambda m: _moe(m).balance_loss_weight),
    Field("dense_act_fn"),
    _T5["is_encoder_decoder"],
    Field("tie_word_embeddings", "tie_word_embeddings", bool),
]
OWNED = owned_keys(FIELDS, "encoder_sparse_step", "decoder_sparse_step")
SUPPORTED = ("SwitchTransformersForConditionalGeneration",)


def sparse_layers(layers: int, step: int) -> list[int]:
    """transformers' sparse layers: every ``step``-th from layer 1 (all of them when ``step`` is 1)."""
    return [i for i in range(layers) if step == 1 or i % step == 1]


class SwitchFamily(HFFamily):
    name = "switch_transformers"
    model_types = ("switch_transformers",)
    # T5's layout with routers: tried before T5
    layout = KeyLayout(contains=(".mlp.router.classifier.",), rank=50)
    tokenizer_kind = "sentencepiece"
    tokenizer_class = "T5Tokenizer"
    spm_files = ("spiece.model",)
    spm_layout = "t5"
    default_special_tokens = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}
    token_types = False

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder_decoder" and positions(model) == "relative" and mixture(model)

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForConditionalGeneration") else {}

    def rules(self, *, encoder_layers: int, decoder_layers: int, encoder_step: int, decoder_step: int, experts: int,
              head: str, lm: str) -> list[Rule]:
        rules = expand(SHARED + HEADS[head], lm=lm)
        for s, layers, step, ff, attention in (("encoder", encoder_layers, encoder_step, "1", SELF_ATTENTION),
                                               ("decoder", decoder_layers, decoder_step, "2",
                                                SELF_ATTENTION + CROSS_ATTENTION)):
            sparse = set(sparse_layers(layers, step))
            rules += expand(attention, s=s, layer=range(layers))
            rules += expand(DENSE, s=s, layer=[i for i in range(layers) if i not in sparse], ff=ff)
            moe: list[RuleSpec] = [
                ("{s}.layers.{layer}.ffn.router.weight", "{s}.block.{layer}.layer.{ff}.mlp.router.classifier.weight"),
                ("{s}.layers.{layer}.ffn_norm.weight", "{s}.block.{layer}.layer.{ff}.layer_norm.weight")]
            for ours, theirs in (("up", "wi"), ("down", "wo")):
                moe.append((f"{{s}}.layers.{{layer}}.ffn.experts.{ours}",
                            tuple(f"{{s}}.block.{{layer}}.layer.{{ff}}.mlp.experts.expert_{e}.{theirs}.weight"
                                  for e in range(experts)), "stack_experts"))
            rules += expand(moe, s=s, layer=sorted(sparse), ff=ff)
            rules += expand(STACK_END, s=s)
        return rules

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = HF_ACTIVATIONS.get(str(c["dense_act_fn"]))
        if act is None:
            problems.append(f"dense_act_fn '{c['dense_act_fn']}' (pentad converts dense experts: "
                            f"{', '.join(HF_ACTIVATIONS)})")
        if c["router_bias"]:
            problems.append("router_bias true (pentad's router has no bias)")
        layers = int(c["num_layers"])
        decoder_layers = int(c["num_decoder_layers"] if c["num_decoder_layers"] is not None else layers)
        steps = []
        for stack, n in (("encoder", layers), ("decoder", decoder_layers)):
            sparse = int(c[f"num_sparse_{stack}_layers"])
            if sparse <= 0:
                problems.append(f"num_sparse_{stack}_layers {sparse} (a stack without experts: convert it as t5)")
            steps.append(n // sparse if sparse > 0 else 1)
        if problems:
            raise UserError(f"cannot convert {label} (switch_transformers): " + "; ".join(problems) + ".")
        hidden, heads, head = int(c["d_model"]), int(c["num_heads"]), int(c["d_kv"])
        dropout = float(c["dropout_rate"])
        tied = bool(c["tie_word_embeddings"])
        moe = {"num_experts": int(c["num_experts"]), "top_k": 1, "expert": "dense", "normalize": False,
               "balance_loss_weight": float(c["router_aux_loss_coef"]), "z_loss_weight": float(c["router_z_loss_coef"])}
        embedding = {"parts": [{"type": "word"}], "norm": False, "dropout": dropout}
        model = import_fields(FIELDS, c, {
            "max_seq_length": seq_length(max_length, None), "share_embedding": True,
            "embedding": embedding, "target_embedding": dict(embedding),
            "encoder": {"type": "transformer", "ffn": "moe", "activation": act, "norm": "t5", "norm_position": "pre",
                        "final_norm": True, "attention_dropout": dropout, "bias": False, "attention_scale": False,
                        "positions": "relative"},
            "targets": [{"type": "lm", "scale_hidden": tied}],
        })
        stack = model["encoder"]
        if head * heads != hidden:
            stack["head_size"] = head

        def placed(step: int) -> dict[str, Any]:
            first = 1 if step > 1 else 0  # written only where pentad's default (every - 1) differs
            return {**moe, "every": step, **({"first": first} if first != step - 1 else {})}

        model["decoder"] = {**stack, "num_layers": decoder_layers, "moe": placed(steps[1])}
        model["encoder"] = {**stack, "mask": "bidirectional", "moe": placed(steps[0])}
        notes = [f"dropless: transformers caps each expert at expert_capacity {c['expert_capacity']} tokens per "
                 "sequence, pentad routes every token (set model.encoder.moe.capacity_factor and "
                 "model.decoder.moe.capacity_factor to drop)"]
        if float(c["router_jitter_noise"]):
            notes.append(f"router_jitter_noise {c['router_jitter_noise']} (training-time noise on the router input) "
                         "is not reproduced")
        rules = self.rules(encoder_layers=layers, decoder_layers=decoder_layers, encoder_step=steps[0],
                           decoder_step=steps[1], experts=moe["num_experts"], head="tied" if tied else "untied",
                           lm="lm")
        return ImportPlan(model, rules, "SwitchTransformersForConditionalGeneration", [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc, dec = model.encoder, model.decoder
        if dec is None or model.target_embedding is None:
            raise UserError(f"cannot export {label} as switch_transformers: it has no decoder.")
        for path, slot in (("model.embedding", model.embedding), ("model.target_embedding", model.target_embedding)):
            if [p.type for p in slot.parts] != ["word"] or slot.norm or getattr(slot.parts[0], "scale", False):
                problems.append(f"{path} must be an unscaled word table alone without a norm")
        if not model.share_embedding:
            problems.append("Switch Transformers share one word table (share_embedding: true)")
        for f in ("num_heads", "num_kv_heads", "head_size", "ffn_size", "activation", "layer_norm_eps",
                  "relative_buckets", "relative_max_distance", "dropout"):
            if getattr(enc, f) != getattr(dec, f):
                problems.append(f"model.encoder.{f} and model.decoder.{f} differ")
        steps = []
        for path, stack in (("model.encoder", enc), ("model.decoder", dec)):
            final = stack.final_norm if stack.final_norm is not None else stack.norm_position == "pre"
            if stack.norm not in ("t5", "rmsnorm") or stack.norm_position != "pre" or not final or stack.bias:
                problems.append(f"{path} must be pre-norm with T5's RMS norm, a final norm and no biases")
            problems += stack_problems(stack, path, "switch_transformers", model.hidden_size, head_size=True,
                                       norm=stack.norm, ffn="moe", attention_scale=False, positions="relative")
            moe = stack.moe_config
            step = moe.every
            want = {"routing": "top_k", "top_k": 1, "expert": "dense", "normalize": False, "router_input": "hidden",
                    "shared_experts": 0, "first": 1 if step > 1 else 0, "expert_ffn_size": None}
            got = {**moe.model_dump(), "first": moe.every - 1 if moe.first is None else moe.first}
            problems += [f"{path}.moe.{k} is {got[k]!r} where switch_transformers has {v!r}"
                         for k, v in want.items() if got[k] != v and not (k == "expert_ffn_size" and got[k] ==
                                                                           stack.ffn_size)]
            steps.append(step)
        if enc.moe_config.num_experts != dec.moe_config.num_experts:
            problems.append("the encoder and decoder have different numbers of experts")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or \
                bool(targets[0].scale_hidden) != bool(model.tie_word_embeddings):
            problems.append("Switch Transformers have one lm head without a bias, rescaled exactly when tied")
        base = dict(base_config or {})
        act = activation_name(base.get("dense_act_fn"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as switch_transformers: " + "; ".join(problems) + ".")
        moe = enc.moe_config
        capacity = base.get("expert_capacity")
        if capacity is None:
            factor = moe.capacity_factor
            capacity = math.ceil(factor * model.max_seq_length / moe.num_experts) if factor else model.max_seq_length
        pad = pad_id if pad_id is not None else int(base.get("pad_token_id", 0) or 0)
        config = {
            "architectures": ["SwitchTransformersForConditionalGeneration"], "model_type": "switch_transformers",
            **export_fields(FIELDS, model, expert_capacity=int(capacity), dense_act_fn=act,
                            num_sparse_encoder_layers=len(sparse_layers(enc.num_layers, steps[0])),
                            num_sparse_decoder_layers=len(sparse_layers(dec.num_layers, steps[1]))),
            "pad_token_id": pad, "eos_token_id": eos_id if eos_id is not None else base.get("eos_token_id", 1),
        }
        if not base:
            config["decoder_start_token_id"] = pad
        config = merge_config(base, OWNED, config)
        rules = self.rules(encoder_layers=enc.num_layers, decoder_layers=dec.num_layers, encoder_step=steps[0],
                           decoder_step=steps[1], experts=moe.num_experts,
                           head="tied" if model.tie_word_embeddings else "untied", lm=targets[0].target_name)
        return ExportPlan(config, rules, "SwitchTransformersForConditionalGeneration", set(), [])


FAMILY = SwitchFamily()
