"""LLaMA (``model_type: llama``, LLaMA 1-3 and every checkpoint with its layout), both ways.

``LlamaForCausalLM`` (and a bare ``LlamaModel``, which gets the word table as output layer)
becomes a pentad decoder-only model: word table, pre-norm layers with RMSNorm, SwiGLU feed-forward
(``gate_proj`` -> ``ffn.gate``, ``up_proj`` -> ``ffn.up``, ``down_proj`` -> ``ffn.down``), rotary
positions and a final norm. ``num_key_value_heads`` < ``num_attention_heads`` is grouped-query
attention (pentad ``num_kv_heads``): ``q_proj`` [A*D, H], ``k_proj`` and ``v_proj`` [K*D, H] fuse to
pentad's ``qkv`` [(A + 2K)*D, H].

Rotary embedding: transformers and pentad both pair dimension i with i + D/2 ("rotate half"), so
the query and key weights copy unchanged (Meta's original checkpoints and TencentPretrain pair
(2i, 2i+1) and need a row permutation, which :mod:`pentad.tencentpretrain.checkpoint` applies).
``rope_theta`` is pentad's ``rotary_base``. RoPE scaling (``rope_parameters`` in transformers 5,
``rope_scaling`` before; ``rope_type`` or ``type`` ``linear``, ``dynamic``, ``yarn``, ``llama3``,
``longrope``) is pentad's ``rope_scaling`` section under the same key names, both ways, in the
spelling of the config.json it came from; other kinds are refused by name. Dynamic NTK's reference
length is transformers' ``max_position_embeddings`` (pentad's ``original_max_position_embeddings``).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from pentad.components.positions.rope_scaling import KINDS, SCALING_NAMES, RopeScaling
from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    HFFamily,
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
    windowed,
)
from pentad.interop.keymap import Rule, RuleSpec, expand

# {p}: "model." inside LlamaForCausalLM, "" for a bare LlamaModel; {lwb}: weight (and bias).
BODY: list[RuleSpec] = [
    ("embedding.word.weight", "{p}embed_tokens.weight"),
    ("encoder.final_norm.weight", "{p}norm.weight"),
    ((), ("{p}rotary_emb.inv_freq?",), "ignore"),
]
# a layer in parts, which the LLaMA-bodied families (Qwen2-MoE) combine with their own feed-forwards
QKV: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention.qkv.{awb}",
     ("{p}layers.{layer}.self_attn.q_proj.{awb}", "{p}layers.{layer}.self_attn.k_proj.{awb}",
      "{p}layers.{layer}.self_attn.v_proj.{awb}"), "fuse_qkv:{heads}:{kv_heads}"),
]
OUT: list[RuleSpec] = [("encoder.layers.{layer}.attention.out.{awb}", "{p}layers.{layer}.self_attn.o_proj.{awb}")]
NORMS: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention_norm.weight", "{p}layers.{layer}.input_layernorm.weight"),
    ("encoder.layers.{layer}.ffn_norm.weight", "{p}layers.{layer}.post_attention_layernorm.weight"),
    ((), ("{p}layers.{layer}.self_attn.rotary_emb.inv_freq?",), "ignore"),
]
MLP: list[RuleSpec] = [
    ("encoder.layers.{layer}.ffn.gate.{mwb}", "{p}layers.{layer}.mlp.gate_proj.{mwb}"),
    ("encoder.layers.{layer}.ffn.up.{mwb}", "{p}layers.{layer}.mlp.up_proj.{mwb}"),
    ("encoder.layers.{layer}.ffn.down.{mwb}", "{p}layers.{layer}.mlp.down_proj.{mwb}"),
]
LAYER: list[RuleSpec] = QKV + OUT + NORMS + MLP
HEADS: dict[str, list[RuleSpec]] = {
    "tied": [("embedding.word.weight", "lm_head.weight?", "tied")],
    # a LlamaModel (tie_word_embeddings false, no lm_head) imported with the word table as output:
    # written back as a copy, so that LlamaForCausalLM gets the same output layer
    "tied-written": [("embedding.word.weight", "lm_head.weight", "tied")],
    "untied": [("targets.{lm}.output.weight", "lm_head.weight")],
}

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "mlp_bias": False, "head_dim": None, "pretraining_tp": 1,
}
# config.json <-> pentad, the part every LLaMA-bodied family (Mixtral, Qwen2-MoE) shares, in the order
# config.json is written; the heads' key/value count, head width, activation, position limit and tying are
# computed on import (body_model)
BODY_FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("hidden_size", "hidden_size", int),
    Field("intermediate_size", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("num_hidden_layers", "encoder.num_layers", int),
    Field("num_attention_heads", "encoder.num_heads", int),
    Field("num_key_value_heads", write=lambda m: m.encoder.num_kv_heads or m.encoder.num_heads),
    Field("head_dim", write=lambda m: m.encoder.head_size or m.hidden_size // m.encoder.num_heads),
    Field("hidden_act"),
    Field("max_position_embeddings", write=lambda m: m.max_seq_length),
    Field("initializer_range", "init_std", float),
    Field("rms_norm_eps", "encoder.layer_norm_eps", float),
    Field("tie_word_embeddings", write=lambda m: m.tie_word_embeddings),
]
ATTENTION_DROPOUT = Field("attention_dropout", "encoder.attention_dropout", float,
                          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                                          else m.encoder.dropout))
FIELDS: list[Field] = BODY_FIELDS + [Field("attention_bias", write=lambda m: m.encoder.bias),
                                     Field("mlp_bias", write=lambda m: m.encoder.bias), ATTENTION_DROPOUT]
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling")
OWNED = owned_keys(FIELDS, *ROPE_KEYS)
SUPPORTED = ("LlamaForCausalLM", "LlamaModel")


def rope_section(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE dict transformers reads from a config.json: a non-empty legacy ``rope_scaling`` wins
    over ``rope_parameters``, as in transformers' config."""
    legacy = config.get("rope_scaling")
    if isinstance(legacy, dict) and legacy:
        return legacy
    params = config.get("rope_parameters")
    return params if isinstance(params, dict) else {}


def rope_kind(section: dict[str, Any]) -> str:
    return str(section.get("rope_type", section.get("type", "default")))


def rope_theta(config: dict[str, Any]) -> float:
    """The rotary base of a config (transformers 5 ``rope_parameters``, older ``rope_theta`` + ``rope_scaling``)."""
    return float(rope_section(config).get("rope_theta", config.get("rope_theta", 10000.0)))


def rope(config: dict[str, Any], problems: list[str]) -> float:
    """The rotary base of a config for a family without RoPE scaling (Mixtral, Qwen2-MoE): a scaled kind
    is a problem."""
    kind = rope_kind(rope_section(config))
    if kind != "default":
        problems.append(f"RoPE scaling '{kind}' (pentad converts RoPE scaling for llama only)")
    return rope_theta(config)


# the keys of each scaled kind's rope dict, as pentad's rope_scaling fields (dynamic NTK's reference length
# is max_position_embeddings in transformers)
SCALING_CLASSES = dict(zip(SCALING_NAMES, KINDS))
SCALING_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(k for k in cls.model_fields if k != "type" and not (name == "dynamic" and k.startswith("original")))
    for name, cls in SCALING_CLASSES.items()}
ROPE_TAGS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def rope_scaling(config: dict[str, Any], max_positions: int, max_seq_length: int, head_dim: int,
                 problems: list[str]) -> dict[str, Any] | None:
    """pentad's ``rope_scaling`` section of a LLaMA config.json (None: unscaled). Defaults that pentad takes
    from ``model.max_seq_length`` (the original length; YaRN's and LongRoPE's factor) are written out when
    ``max_seq_length`` differs from ``max_positions``, so that they keep transformers' values."""
    section = rope_section(config)
    kind = rope_kind(section)
    if kind == "default":
        return None
    if kind not in SCALING_CLASSES:
        problems.append(f"rope_type '{kind}' in the RoPE parameters (pentad converts the RoPE scaling kinds "
                        f"{', '.join(SCALING_NAMES)})")
        return None
    keys = SCALING_KEYS[kind]
    unknown = sorted(set(section) - set(keys) - set(ROPE_TAGS))
    if unknown:
        problems.append(f"RoPE parameters {', '.join(unknown)} for rope_type '{kind}' (pentad converts "
                        f"{', '.join(keys)})")
    if section.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor {section['partial_rotary_factor']} (LLaMA rotates whole heads)")
    out: dict[str, Any] = {"type": kind, **{k: section[k] for k in keys if section.get(k) is not None}}
    if max_seq_length != max_positions:
        if kind == "dynamic" or "original_max_position_embeddings" in keys:
            out.setdefault("original_max_position_embeddings", max_positions)
        if kind in ("yarn", "longrope"):
            out.setdefault("factor", max_positions / out["original_max_position_embeddings"])
    try:
        scaling = TypeAdapter(RopeScaling).validate_python(out)
    except ValidationError as e:
        found = "; ".join(f"{'.'.join(str(x) for x in err['loc'][1:]) or kind}: {err['msg']}" for err in e.errors())
        problems.append(f"RoPE parameters of rope_type '{kind}' ({found})")
        return None
    problems += [f"RoPE parameters: {path.removeprefix('rope_scaling.')} {message}"
                 for path, message in scaling.problems(head_dim)]
    return out


def rope_export(enc: Any, base: dict[str, Any]) -> dict[str, Any]:
    """config.json's RoPE keys of a pentad stack, in the spelling of ``base`` (the config.json it was imported
    from): transformers 5's ``rope_parameters``, or the older ``rope_theta`` with ``rope_scaling`` (its kind
    under ``type``, ``rope_type`` or both, as there)."""
    theta = float(enc.rotary_base)
    scaling = enc.rope_scaling
    if scaling is None:
        fields: dict[str, Any] = {}
    else:
        fields = {k: v for k, v in scaling.model_dump().items()
                  if k in SCALING_KEYS[scaling.type] and v is not None}
    if scaling is not None and "partial_rotary_factor" in rope_section(base):  # accepted on import only as 1.0
        fields["partial_rotary_factor"] = rope_section(base)["partial_rotary_factor"]
    legacy = "rope_parameters" not in base and ("rope_theta" in base or isinstance(base.get("rope_scaling"), dict))
    if not legacy:
        if scaling is None:
            return {"rope_parameters": {"rope_theta": theta, "rope_type": "default"}}
        return {"rope_parameters": {"rope_type": scaling.type, **fields, "rope_theta": theta}}
    out: dict[str, Any] = {}
    if "rope_theta" in base or theta != 10000.0:
        out["rope_theta"] = theta
    old = base.get("rope_scaling") if isinstance(base.get("rope_scaling"), dict) else {}
    if scaling is None:
        out["rope_scaling"] = None
    else:
        tags = [t for t in ("type", "rope_type") if t in old] or ["rope_type"]
        out["rope_scaling"] = {**{t: scaling.type for t in tags}, **fields}
        if "rope_theta" in old:
            out["rope_scaling"]["rope_theta"] = theta
    return out


def dynamic_positions(enc: Any, max_seq_length: int) -> int | None:
    """max_position_embeddings of a dynamic-NTK stack: transformers' reference length, pentad's original one."""
    scaling = enc.rope_scaling
    if scaling is None or scaling.type != "dynamic":
        return None
    return scaling.original_max_position_embeddings or max_seq_length


def body_problems(model: Any, family: str, display: str, scaling: bool = False, **stack_expected: Any) -> list[str]:
    """What a pentad model lacks to be a LLaMA-bodied HF model (word table, pre-norm causal stack with
    a final norm, rotary positions, RoPE scaling only where ``scaling``, one unbiased lm head);
    ``stack_expected`` as for ``stack_problems``."""
    problems: list[str] = []
    enc = model.encoder
    if not scaling and getattr(enc, "rope_scaling", None) is not None:
        problems.append(f"model.encoder.rope_scaling ({enc.rope_scaling.type}): pentad converts RoPE scaling to "
                        f"llama only, not to {display}")
    if model.decoder is not None:
        problems.append(f"the model has a decoder; {display} is decoder-only (one causal stack)")
    if [p.type for p in model.embedding.parts] != ["word"] or model.embedding.norm or \
            getattr(model.embedding.parts[0], "scale", False):
        problems.append("model.embedding must be an unscaled word table alone without a norm")
    if model.embedding_size not in (None, model.hidden_size):
        problems.append(f"model.embedding_size {model.embedding_size} ({display} has no factorised embedding)")
    final = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
    if enc.type != "transformer" or enc.norm_position != "pre" or not final or enc.mask != "causal":
        problems.append("model.encoder must be a pre-norm causal transformer with a final norm")
    else:
        problems += stack_problems(enc, "model.encoder", family, model.hidden_size, grouped=True, head_size=True,
                                   norm=enc.norm if enc.norm in ("rmsnorm", "t5") else "rmsnorm",
                                   positions="rotary", **stack_expected)
    targets = list(model.targets)
    if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or targets[0].scale_hidden:
        problems.append(f"targets {[t.type for t in targets]}: {display} has one lm head without a bias")
    return problems


def rope_and_tokens(config: dict[str, Any], base: dict[str, Any], model: Any, eos_id: int | None) -> None:
    """Fill an exported LLaMA-bodied config in place: the rotary base in the spelling of the config
    it was imported from, its position limit when that is larger, and the special token ids."""
    config["rope_parameters"] = {"rope_theta": float(model.encoder.rotary_base), "rope_type": "default"}
    if "rope_theta" in base and "rope_parameters" not in base:
        # an older config.json: keep its spelling
        del config["rope_parameters"]
        config["rope_theta"] = float(model.encoder.rotary_base)
    if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
        config["max_position_embeddings"] = base["max_position_embeddings"]
    for key, value in (("bos_token_id", None), ("eos_token_id", eos_id)):
        if key not in base and value is not None:
            config[key] = value


def body_model(c: dict[str, Any], act: str, rotary_base: float, max_length: int | None, tied: bool, *,
               ffn: str, bias: bool, **encoder_options: Any) -> dict[str, Any]:
    """The pentad model config of a LLaMA-style decoder (LLaMA, Mixtral, Qwen2-MoE) from its HF config
    ``c`` (defaults filled in): word embedding, pre-RMSNorm causal transformer with rotary positions,
    grouped-query heads and a head size when they differ, an ``lm`` target; ``ffn``, ``bias`` and
    ``encoder_options`` (``moe``, ``qkv_bias``) are the family's."""
    model = import_fields(BODY_FIELDS + [ATTENTION_DROPOUT], c, {
        "max_seq_length": seq_length(max_length, int(c["max_position_embeddings"])), "tie_word_embeddings": tied,
        "embedding": {"parts": [{"type": "word"}], "norm": False, "dropout": 0.0},
        "encoder": {"type": "transformer", "ffn": ffn, "activation": act, "norm": "rmsnorm", "norm_position": "pre",
                    "final_norm": True, "mask": "causal", "dropout": 0.0, "bias": bias, "positions": "rotary",
                    "rotary_base": rotary_base, **encoder_options},
        "targets": [{"type": "lm"}],
    })
    encoder, hidden = model["encoder"], model["hidden_size"]
    heads = encoder["num_heads"]
    kv_heads = int(c["num_key_value_heads"] or heads)
    head = int(c.get("head_dim") or hidden // heads)
    if kv_heads != heads:
        encoder["num_kv_heads"] = kv_heads
    if head * heads != hidden:
        encoder["head_size"] = head
    return model


class LlamaFamily(HFFamily):
    name = "llama"
    model_types = ("llama",)
    layout = KeyLayout(contains=(".mlp.gate_proj.",))
    tokenizer_kind = "sentencepiece"
    tokenizer_class = "LlamaTokenizer"
    spm_files: tuple[str, ...] = ("tokenizer.model",)
    default_special_tokens = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    token_types = False

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "rotary" and not mixture(model) \
            and windowed(model) == "none"

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForCausalLM") else {}

    def rules(self, *, prefix: str, num_layers: int, heads: int, kv_heads: int, attention_bias: bool,
              mlp_bias: bool, head: str, lm: str) -> list[Rule]:
        """head: "tied", "tied-written" or "untied" (see ``HEADS``)."""
        specs = BODY + LAYER + HEADS[head]
        return expand(specs, p=prefix, layer=range(num_layers), heads=heads, kv_heads=kv_heads, lm=lm,
                      awb=("weight", "bias") if attention_bias else ("weight",),
                      mwb=("weight", "bias") if mlp_bias else ("weight",))

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        act = activation(c["hidden_act"], problems)
        base = rope_theta(config)
        if bool(c["attention_bias"]) != bool(c["mlp_bias"]):
            problems.append(f"attention_bias {c['attention_bias']} with mlp_bias {c['mlp_bias']} (pentad has one bias "
                            "switch for attention and feed-forward)")
        heads = int(c["num_attention_heads"])
        kv_heads = int(c["num_key_value_heads"] or heads)
        prefix = "model." if any(k.startswith("model.") for k in keys) else ""
        has_head = "lm_head.weight" in keys
        tied = bool(c["tie_word_embeddings"]) or not has_head
        notes = []
        if not has_head and not c["tie_word_embeddings"]:
            notes.append("LlamaModel has no lm_head: the pentad lm target uses the word embedding (tied)")
        max_positions = int(c["max_position_embeddings"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        scaling = rope_scaling(config, max_positions, seq_length(max_length, max_positions), head_dim, problems)
        if problems:
            raise UserError(f"cannot convert {label} (llama): " + "; ".join(problems) + ".")
        model = body_model(c, act, base, max_length, tied, ffn="gated", bias=bool(c["attention_bias"]))
        if scaling is not None:
            model["encoder"]["rope_scaling"] = scaling
        rules = self.rules(prefix=prefix, num_layers=int(c["num_hidden_layers"]), heads=heads, kv_heads=kv_heads,
                           attention_bias=bool(c["attention_bias"]), mlp_bias=bool(c["mlp_bias"]),
                           head="tied" if tied else "untied", lm="lm")
        arch = "LlamaForCausalLM" if has_head or prefix else "LlamaModel"
        return ImportPlan(model, rules, arch, [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        enc = model.encoder
        problems = body_problems(model, "llama", "LLaMA", scaling=True, ffn="gated")
        targets = list(model.targets)
        base = dict(base_config or {})
        act = activation_name(base.get("hidden_act"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as llama: " + "; ".join(problems) + ".")
        heads = enc.num_heads
        kv_heads = enc.num_kv_heads or heads
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            **export_fields(FIELDS, model, hidden_act=act),
            **rope_export(enc, base),
        }
        if "max_position_embeddings" in base and int(base["max_position_embeddings"]) >= model.max_seq_length:
            config["max_position_embeddings"] = base["max_position_embeddings"]
        if dynamic_positions(enc, model.max_seq_length) is not None:  # dynamic NTK's reference length
            config["max_position_embeddings"] = dynamic_positions(enc, model.max_seq_length)
        for key, value in (("bos_token_id", None), ("eos_token_id", eos_id)):
            if key not in base and value is not None:
                config[key] = value
        head = "tied" if model.tie_word_embeddings else "untied"
        if model.tie_word_embeddings and base.get("tie_word_embeddings") is False:
            head = "tied-written"  # imported from a LlamaModel: keep its config, write the output layer
            config["tie_word_embeddings"] = False
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="model.", num_layers=enc.num_layers, heads=heads, kv_heads=kv_heads,
                           attention_bias=enc.bias, mlp_bias=enc.bias, head=head, lm=targets[0].target_name)
        return ExportPlan(config, rules, "LlamaForCausalLM", set(), [])


FAMILY = LlamaFamily()
