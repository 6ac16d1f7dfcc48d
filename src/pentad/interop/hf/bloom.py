"""BLOOM (``model_type: bloom``): key map and config translation, both ways.

``BloomForCausalLM`` (and a bare ``BloomModel``) becomes a pentad decoder-only model: word table
with a LayerNorm (``word_embeddings_layernorm``), pre-norm layers with biases, GELU (tanh
approximation), ALiBi position bias (Press et al. 2022; BLOOM's slopes are pentad's), a final norm
and an output layer tied to the word table.

**Fused attention projection.** ``self_attention.query_key_value`` [3H, H] holds its rows per head:
[q_0; k_0; v_0; q_1; k_1; v_1; ...] (each block head_size rows). pentad's ``attention.qkv`` holds
all queries, then all keys, then all values; the ``heads_qkv`` transform regroups the rows (and
the bias) both ways.

BLOOM adds ``slope * key_position`` to the scores where pentad adds ``-slope * (query - key)``: the
two differ by a constant per query row, which softmax ignores. HF counts key positions over the
non-padding tokens, so the two agree on right-padded batches (how pentad builds them).
The tokenizer (a byte-level BPE ``tokenizer.json`` with its own pre-tokenizer) is copied byte for
byte and used as it is through pentad's ``tokenizer_json`` tokenizer (the ``tokenizers`` library).
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    KeyLayout,
    export_fields,
    hinted_problems,
    import_fields,
    merge_config,
    owned_keys,
    positions,
    seq_length,
    stack_problems,
    text_kind,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {p}: "transformer." inside BloomForCausalLM, "" for a bare BloomModel.
BODY: list[RuleSpec] = [
    ("embedding.word.weight", "{p}word_embeddings.weight"),
    ("embedding.norm.{wb}", "{p}word_embeddings_layernorm.{wb}"),
    ("encoder.final_norm.{wb}", "{p}ln_f.{wb}"),
]
LAYER: list[RuleSpec] = [
    ("encoder.layers.{layer}.attention_norm.{wb}", "{p}h.{layer}.input_layernorm.{wb}"),
    ("encoder.layers.{layer}.attention.qkv.{wb}", "{p}h.{layer}.self_attention.query_key_value.{wb}",
     "heads_qkv:{heads}"),
    ("encoder.layers.{layer}.attention.out.{wb}", "{p}h.{layer}.self_attention.dense.{wb}"),
    ("encoder.layers.{layer}.ffn_norm.{wb}", "{p}h.{layer}.post_attention_layernorm.{wb}"),
    ("encoder.layers.{layer}.ffn.up.{wb}", "{p}h.{layer}.mlp.dense_h_to_4h.{wb}"),
    ("encoder.layers.{layer}.ffn.down.{wb}", "{p}h.{layer}.mlp.dense_4h_to_h.{wb}"),
]
HEAD_TIED: list[RuleSpec] = [("embedding.word.weight", "lm_head.weight?", "tied")]
HEAD_UNTIED: list[RuleSpec] = [("targets.{lm}.output.weight", "lm_head.weight")]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02, "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "tie_word_embeddings": True,
}
# config.json <-> pentad, in the order config.json is written. Computed on import: the width (older
# configs say n_embed), tying.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("hidden_size", write=lambda m: m.hidden_size),
    Field("n_layer", "encoder.num_layers", int),
    Field("n_head", "encoder.num_heads", int),
    Field("layer_norm_epsilon", "encoder.layer_norm_eps", float),
    Field("initializer_range", "init_std", float),
    Field("apply_residual_connection_post_layernorm", write=lambda m: False),
    Field("hidden_dropout", "encoder.dropout", float),
    Field("attention_dropout", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout)),
    Field("tie_word_embeddings", write=lambda m: m.tie_word_embeddings),
]
OWNED = owned_keys(FIELDS, "n_embed")
SUPPORTED = ("BloomForCausalLM", "BloomModel")


class BloomFamily(HFFamily):
    name = "bloom"
    model_types = ("bloom",)
    layout = KeyLayout(contains=("self_attention.query_key_value", "word_embeddings_layernorm"))
    tokenizer_kind = "tokenizer_json"
    tokenizer_class = "TokenizersBackend"  # transformers' generic tokenizer.json class (BLOOM has no own one)
    default_special_tokens = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
    token_types = False

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) == "alibi"

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForCausalLM") else {}

    def rules(self, *, prefix: str, num_layers: int, heads: int, tied: bool, lm: str) -> list[Rule]:
        return expand(BODY + LAYER + (HEAD_TIED if tied else HEAD_UNTIED), p=prefix, layer=range(num_layers), wb=WB,
                      heads=heads, lm=lm)

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        if c.get("apply_residual_connection_post_layernorm"):
            problems.append("apply_residual_connection_post_layernorm (the residual taken after the norm) is not a "
                            "pentad layer")
        tp = int(c.get("pretraining_tp") or 1)
        if tp > 1 and c.get("slow_but_exact"):
            problems.append(
                f"\"pretraining_tp\": {tp} with \"slow_but_exact\": true, a mode in which transformers' BLOOM "
                f"computes self_attention.dense and mlp.dense_4h_to_h as sums of {tp} sliced products and leaves out "
                "both layers' biases, so it runs a different model from these weights (the biases are trained and "
                "stored; slow_but_exact false, as BLOOM checkpoints ship, adds them and ignores pretraining_tp). "
                "pentad does not reproduce the dropped biases: set \"slow_but_exact\": false in config.json to "
                "convert the model with its biases")
        if problems:
            raise UserError(f"cannot convert {label} (bloom): " + "; ".join(problems) + ".")
        hidden = int(c.get("n_embed", c["hidden_size"]))
        heads, layers = int(c["n_head"]), int(c["n_layer"])
        eps = float(c["layer_norm_epsilon"])
        prefix = "transformer." if any(k.startswith("transformer.") for k in keys) else ""
        has_head = "lm_head.weight" in keys
        tied = bool(c["tie_word_embeddings"]) or not has_head
        model = import_fields(FIELDS, c, {
            "hidden_size": hidden, "max_seq_length": seq_length(max_length, None, 2048), "tie_word_embeddings": tied,
            "embedding": {"parts": [{"type": "word"}], "norm": True, "layer_norm_eps": eps,
                          "dropout": float(c["hidden_dropout"])},
            "encoder": {"type": "transformer", "ffn_size": 4 * hidden, "activation": "gelu_tanh",
                        "norm_position": "pre", "final_norm": True, "mask": "causal", "bias": True,
                        "positions": "alibi"},
            "targets": [{"type": "lm"}],
        })
        notes = ["ALiBi needs no position table: max_seq_length (2048 unless the tokenizer says otherwise) only "
                 "bounds pentad's data pipeline"]
        rules = self.rules(prefix=prefix, num_layers=layers, heads=heads, tied=tied, lm="lm")
        arch = "BloomForCausalLM" if has_head or prefix else "BloomModel"
        return ImportPlan(model, rules, arch, [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc = model.encoder
        emb = model.embedding
        if model.decoder is not None:
            problems.append("the model has a decoder; BLOOM is decoder-only (one causal stack)")
        if [p.type for p in emb.parts] != ["word"] or not emb.norm or getattr(emb.parts[0], "scale", False):
            problems.append("model.embedding must be an unscaled word table with a LayerNorm")
        if model.embedding_size not in (None, model.hidden_size):
            problems.append(f"model.embedding_size {model.embedding_size} (BLOOM has no factorised embedding)")
        final = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
        if enc.type != "transformer" or enc.norm_position != "pre" or not final or enc.mask != "causal" or not enc.bias:
            problems.append("model.encoder must be a pre-norm causal transformer with biases and a final norm")
        else:
            problems += stack_problems(enc, "model.encoder", "bloom", model.hidden_size, positions="alibi")
        if enc.activation != "gelu_tanh":
            problems.append(f"activation '{enc.activation}'; BLOOM uses the tanh approximation of GELU (gelu_tanh)")
        if (enc.ffn_size or 4 * model.hidden_size) != 4 * model.hidden_size:
            problems.append(f"ffn_size {enc.ffn_size}; BLOOM's feed-forward is 4 x hidden_size")
        if float(emb.layer_norm_eps) != float(enc.layer_norm_eps):
            problems.append("the embedding and layer norms have different eps; BLOOM has one layer_norm_epsilon")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias or targets[0].scale_hidden:
            problems.append(f"targets {[t.type for t in targets]}: BLOOM has one lm head without a bias")
        if problems:
            raise UserError(f"cannot export {label} as bloom: " + "; ".join(problems) + ".")
        base = dict(base_config or {})
        config: dict[str, Any] = {"architectures": ["BloomForCausalLM"], "model_type": "bloom",
                                  **export_fields(FIELDS, model)}
        if "eos_token_id" not in base and eos_id is not None:
            config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="transformer.", num_layers=enc.num_layers, heads=enc.num_heads,
                           tied=model.tie_word_embeddings, lm=targets[0].target_name)
        return ExportPlan(config, rules, "BloomForCausalLM", set(), [])


FAMILY = BloomFamily()
