"""Gemma 3 text (``model_type: gemma3_text``: ``Gemma3ForCausalLM``), both ways.

A decoder-only stack of Gemma's pieces, each a pentad option:

* the word table scaled by sqrt(hidden_size) (``word.scale: true``), tied to the output (``lm``);
* Gemma's RMSNorm ``x * (1 + w)`` (``norm: gemma_rmsnorm``) in a sandwich (``norm_position: sandwich``):
  ``input_layernorm`` -> ``attention_norm``, ``post_attention_layernorm`` -> ``attention_output_norm``,
  ``pre_feedforward_layernorm`` -> ``ffn_norm``, ``post_feedforward_layernorm`` -> ``ffn_output_norm``,
  ``norm`` -> the final norm;
* GeGLU (``ffn: gated`` with ``gelu_tanh``, ``hidden_activation: gelu_pytorch_tanh``);
* per-head query/key norms before the rotary rotation (``qk_norm: before_rotary``, of the stack's norm
  kind: ``self_attn.q_norm``/``k_norm`` -> ``attention.q_norm``/``k_norm``);
* scores scaled by 1/sqrt(``query_pre_attn_scalar``) (``attention_scale_size``);
* local and global layers: ``layer_types`` (``sliding_attention`` / ``full_attention``; older configs:
  ``sliding_window_pattern``, every n-th layer global) -> ``window_pattern`` (its shortest period, e.g.
  five local then one global), ``sliding_window`` -> ``sliding_window`` (kept when every layer is global:
  transformers needs one; a pentad stack without a window exports its ``max_seq_length``);
* per-layer rotary bases: the global layers' ``rope_parameters.full_attention`` (``rope_theta``, and
  RoPE scaling as for LLaMA: Gemma 3 4B-27B use ``linear`` 8) -> ``rotary_base`` / ``rope_scaling``, the
  local layers' unscaled ``rope_parameters.sliding_attention.rope_theta`` -> ``rotary_local_base``
  (transformers before 5: ``rope_theta``, ``rope_scaling`` and ``rope_local_base_freq``; the export
  writes the spelling it imported);
* ``final_logit_softcapping`` -> ``lm.logit_softcap``.

Refused by name: ``attn_logit_softcapping`` (transformers' Gemma 3 does not apply it, and the published
checkpoints leave it null), ``use_bidirectional_attention``, ``attention_bias`` (biases on q, k, v and o
but not the feed-forward), a scaled or another kind of rotary in the local layers, layer types other
than those two, and heads other than ``Gemma3ForCausalLM`` (the multimodal ``gemma3`` is another
``model_type``). The tokenizer is its ``tokenizer.json``.
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
    import_fields,
    merge_config,
    mixture,
    owned_keys,
    positions,
    seq_length,
    stack_problems,
    text_kind,
)
from pentad.interop.hf.llama import (
    ATTENTION_DROPOUT,
    BODY,
    BODY_FIELDS,
    HEADS,
    MLP,
    OUT,
    QKV,
    LlamaFamily,
    rope_kind,
    rope_scaling,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

NORMS: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention_norm.weight", "{p}layers.{layer}.input_layernorm.weight"),
    ("encoder.layers.{layer}.attention_output_norm.weight", "{p}layers.{layer}.post_attention_layernorm.weight"),
    ("encoder.layers.{layer}.ffn_norm.weight", "{p}layers.{layer}.pre_feedforward_layernorm.weight"),
    ("encoder.layers.{layer}.ffn_output_norm.weight", "{p}layers.{layer}.post_feedforward_layernorm.weight"),
    ("encoder.layers.{layer}.attention.q_norm.weight", "{p}layers.{layer}.self_attn.q_norm.weight"),
    ("encoder.layers.{layer}.attention.k_norm.weight", "{p}layers.{layer}.self_attn.k_norm.weight"),
]
DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
    "sliding_window_pattern": 6,
}
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # transformers' defaults
LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}


def _lm(m: Any) -> Any:
    return m.targets[0]


# config.json <-> pentad, in the order config.json is written
FIELDS: list[Field] = [Field("hidden_activation") if f.hf == "hidden_act" else f for f in BODY_FIELDS] + [
    Field("attention_bias", write=lambda m: False),
    ATTENTION_DROPOUT,
    # transformers always scales by it: a stack without attention_scale_size scales by 1/sqrt(head_size)
    Field("query_pre_attn_scalar", write=lambda m: _scalar(m.encoder.attention_scale_size or m.encoder.head_size
                                                           or m.hidden_size // m.encoder.num_heads)),
    # transformers builds the local mask even when no layer is local: a stack without a window writes its length
    Field("sliding_window", write=lambda m: m.encoder.sliding_window or m.max_seq_length),
    Field("layer_types", write=lambda m: [("sliding_attention" if m.encoder.layer_window(i) is not None
                                           else "full_attention") for i in range(m.encoder.num_layers)]),
    Field("final_logit_softcapping", write=lambda m: _lm(m).logit_softcap),
    Field("attn_logit_softcapping", write=lambda m: None),
    Field("use_bidirectional_attention", write=lambda m: False),
]
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "rope_local_base_freq")
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("Gemma3ForCausalLM",)


def _scalar(value: float) -> float | int:
    """query_pre_attn_scalar as config.json holds it (an int where it is one)."""
    return int(value) if float(value).is_integer() else value


def layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's type, as transformers derives it: ``layer_types``, else every ``sliding_window_pattern``-th
    layer global."""
    if c.get("layer_types"):
        return list(c["layer_types"])
    every = int(c["sliding_window_pattern"])
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(int(c["num_hidden_layers"]))]


def shortest_period(items: list[str]) -> list[str]:
    """The shortest prefix that, repeated, gives ``items`` (the whole list when none shorter does)."""
    for size in range(1, len(items) + 1):
        if all(items[i] == items[i % size] for i in range(len(items))):
            return items[:size]
    return items


def rope_sections(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(global layers' RoPE dict, local layers' RoPE dict, whether config.json spells them the transformers 5 way,
    ``rope_parameters`` per layer type)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        full.setdefault("rope_theta", GLOBAL_THETA)
        local.setdefault("rope_theta", LOCAL_THETA)
        return full, local, True
    legacy: dict[str, Any] = config["rope_scaling"] if isinstance(config.get("rope_scaling"), dict) else {}
    full = {"rope_type": "default", **legacy, "rope_theta": config.get("rope_theta", GLOBAL_THETA)}
    return full, {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", LOCAL_THETA)}, False


def rope_export(enc: Any, base: dict[str, Any]) -> dict[str, Any]:
    """config.json's RoPE keys of a pentad stack, in the spelling of ``base`` (transformers 5's when it has none)."""
    scaling = enc.rope_scaling
    fields = {} if scaling is None else {k: v for k, v in scaling.model_dump().items() if k != "type" and v is not None}
    full = {"rope_type": "default" if scaling is None else scaling.type, **fields, "rope_theta": float(enc.rotary_base)}
    local = ({"rope_type": "default", "rope_theta": float(enc.rotary_local_base)} if enc.rotary_local_base is not None
             else dict(full))  # no base of their own: the local layers rotate as the global ones
    _, _, nested = rope_sections(base) if base else ({}, {}, True)
    if nested:
        return {"rope_parameters": {"sliding_attention": local, "full_attention": full}}
    if local != {"rope_type": "default", "rope_theta": local["rope_theta"]}:
        raise UserError("the local layers rotate with RoPE scaling, which the config.json imported (transformers "
                        "before 5: rope_local_base_freq) cannot say; export without the imported config")
    return {"rope_theta": full["rope_theta"], "rope_local_base_freq": local["rope_theta"],
            "rope_scaling": {"rope_type": scaling.type, **fields} if scaling is not None else None}


def gemma_norm(model: Any) -> bool:
    """Gemma's trait: its stack's norms are Gemma's (1 + w) RMSNorm."""
    return getattr(model.encoder, "norm", None) == "gemma_rmsnorm"


class Gemma3Family(LlamaFamily):
    name = "gemma3_text"
    model_types = ("gemma3_text",)
    # a Gemma-normed causal rotary stack is Gemma 3's
    narrows = ("llama", "mistral", "qwen2", "qwen3", "hunyuan_v1_dense")
    layout = KeyLayout(contains=(".pre_feedforward_layernorm.",), also=(".self_attn.q_norm.",), rank=80)
    tokenizer_kind = "tokenizer_json"  # SentencePiece-derived BPE in tokenizer.json: the file as it is
    tokenizer_class = "GemmaTokenizer"
    spm_files = ()
    default_special_tokens = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"}
    logit_softcap = True

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and gemma_norm(model)

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int,  # type: ignore[override]
              head: str, lm: str) -> list[Rule]:
        return expand(BODY + QKV + OUT + NORMS + MLP + HEADS[head], p=prefix, layer=range(num_layers), heads=heads,
                      kv_heads=kv_heads, lm=lm, awb=("weight",), mwb=("weight",))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_activation"], problems, key="hidden_activation")
        for key, why in (("attn_logit_softcapping", "transformers' Gemma 3 does not apply it"),
                         ("use_bidirectional_attention", "pentad converts the causal Gemma 3"),
                         ("attention_bias", "biases on the query, key, value and output projections but not the "
                                            "feed-forward, which pentad's one bias switch cannot hold")):
            if c[key]:
                problems.append(f"{key} {c[key]} ({why})")
        types = layer_types(c)
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            problems.append(f"layer_types {', '.join(unknown)} (pentad converts {', '.join(LAYER_TYPES)})")
        if len(types) != int(c["num_hidden_layers"]):
            problems.append(f"{len(types)} layer_types for {c['num_hidden_layers']} layers")
        window = c["sliding_window"]
        if "sliding_attention" in types and (not isinstance(window, int) or window < 1):
            problems.append(f"sliding_window {window!r} with sliding_attention layers (a positive number of positions)")
        heads = int(c["num_attention_heads"])
        head_dim = int(c["head_dim"] or int(c["hidden_size"]) // heads)
        full, local, _ = rope_sections(config)
        max_positions = int(c["max_position_embeddings"])
        scaling = rope_scaling({"rope_parameters": full}, max_positions, seq_length(max_length, max_positions),
                               head_dim, problems)
        if rope_kind(local) != "default" or set(local) - {"rope_type", "type", "rope_theta"}:
            problems.append(f"RoPE parameters of the sliding_attention layers {local} (pentad rotates local layers "
                            "unscaled at a base of their own)")
        if problems:
            raise UserError(f"cannot convert {label} (gemma3_text): " + "; ".join(problems) + ".")
        tied = bool(c["tie_word_embeddings"])
        kv_heads = int(c["num_key_value_heads"] or heads)
        encoder: dict[str, Any] = {
            "type": "transformer", "ffn": "gated", "activation": act, "norm": "gemma_rmsnorm",
            "norm_position": "sandwich", "final_norm": True, "mask": "causal", "dropout": 0.0, "bias": False,
            "positions": "rotary", "rotary_base": float(full["rope_theta"]), "qk_norm": "before_rotary",
            "attention_scale_size": float(c["query_pre_attn_scalar"]),
            **({"num_kv_heads": kv_heads} if kv_heads != heads else {}),
            **({"head_size": head_dim} if head_dim * heads != int(c["hidden_size"]) else {}),
        }
        if isinstance(window, int):  # kept when every layer is global too: transformers needs it
            encoder.update(sliding_window=window, rotary_local_base=float(local["rope_theta"]),
                           window_pattern=[LAYER_TYPES[t] for t in shortest_period(types)])
        if scaling is not None:
            encoder["rope_scaling"] = scaling
        lm: dict[str, Any] = {"type": "lm"}
        if c["final_logit_softcapping"] is not None:
            lm["logit_softcap"] = float(c["final_logit_softcapping"])
        model = import_fields([f for f in FIELDS if f.path is not None], c, {
            "max_seq_length": seq_length(max_length, max_positions), "tie_word_embeddings": tied,
            "embedding": {"parts": [{"type": "word", "scale": True}], "norm": False, "dropout": 0.0},
            "encoder": encoder, "targets": [lm]})
        rules = self.rules(prefix="model.", num_layers=int(c["num_hidden_layers"]), heads=heads, kv_heads=kv_heads,
                           head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, "Gemma3ForCausalLM", [], [])

    def export_problems(self, model: Any) -> list[str]:
        problems: list[str] = []
        enc = model.encoder
        if model.decoder is not None:
            problems.append("the model has a decoder; Gemma 3 is decoder-only (one causal stack)")
        parts = model.embedding.parts
        if [p.type for p in parts] != ["word"] or not parts[0].scale or model.embedding.norm:
            problems.append("model.embedding must be a word table scaled by sqrt(hidden_size) (word.scale) alone "
                            "without a norm")
        if model.embedding_size not in (None, model.hidden_size):
            problems.append(f"model.embedding_size {model.embedding_size} (Gemma 3 has no factorised embedding)")
        final = enc.final_norm if enc.final_norm is not None else enc.norm_position == "sandwich"
        if enc.type != "transformer" or enc.norm_position != "sandwich" or not final or enc.mask != "causal":
            problems.append("model.encoder must be a sandwich-norm causal transformer with a final norm")
        else:
            problems += stack_problems(enc, "model.encoder", "gemma3_text", model.hidden_size, grouped=True,
                                       head_size=True, norm="gemma_rmsnorm", ffn="gated", positions="rotary",
                                       bias=False, qk_norm="before_rotary", sliding_window=enc.sliding_window,
                                       window_pattern=enc.window_pattern, rotary_local_base=enc.rotary_local_base,
                                       attention_scale_size=enc.attention_scale_size)
            if enc.final_norm_kind not in (None, "gemma_rmsnorm") or \
                    enc.final_norm_eps not in (None, enc.layer_norm_eps):
                problems.append("model.encoder's final norm must be the layers' kind with their eps")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or targets[0].scale_hidden:
            problems.append(f"targets {[t.type for t in targets]}: Gemma 3 has one lm head without a bias")
        return problems

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = self.export_problems(model)
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_activation"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as gemma3_text: " + "; ".join(problems) + ".")
        config: dict[str, Any] = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                                  **export_fields(FIELDS, model, hidden_activation=act), **rope_export(enc, base)}
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        heads = enc.num_heads
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads,
                           kv_heads=enc.num_kv_heads or heads, head="tied" if model.tie_word_embeddings else "untied",
                           lm=model.targets[0].target_name)
        return ExportPlan(config, rules, "Gemma3ForCausalLM", set(), [])


FAMILY = Gemma3Family()
