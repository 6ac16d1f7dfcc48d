"""GPT-2 (``model_type: gpt2``): key map and config translation, both ways.

``GPT2LMHeadModel`` and ``GPT2Model`` both become a pentad model with an ``lm`` target (a bare
``GPT2Model`` gets the tied output layer, which has no tensor of its own, so nothing is invented);
the export always writes ``GPT2LMHeadModel``, which ``AutoModel`` also loads as a ``GPT2Model``.

GPT-2's ``Conv1D`` stores weights as [in, out] (it computes ``x @ W + b``), the transpose of
``nn.Linear``; ``c_attn`` [H, 3H] has columns [q | k | v], so its transpose is exactly pentad's
fused ``qkv`` [3H, H] with rows [q; k; v]. Older checkpoints carry the causal-mask buffers
``attn.bias`` / ``attn.masked_bias``, which hold no learned data and are skipped.
"""

from __future__ import annotations

from typing import Any

from pentad.errors import UserError
from pentad.interop.hf import (
    HF_ACTIVATIONS,
    PENTAD_ACTIVATIONS,
    ExportPlan,
    Field,
    HFFamily,
    ImportPlan,
    KeyLayout,
    export_fields,
    import_fields,
    merge_config,
    owned_keys,
    positions,
    stack_problems,
    text_kind,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {prefix}: "transformer." inside GPT2LMHeadModel, "" for a bare GPT2Model checkpoint.
BODY: list[RuleSpec] = [
    ("embedding.word.weight", "{prefix}wte.weight"),
    ("embedding.pos.weight", "{prefix}wpe.weight"),
    ("encoder.layers.{layer}.attention_norm.{wb}", "{prefix}h.{layer}.ln_1.{wb}"),
    ("encoder.layers.{layer}.attention.qkv.weight", "{prefix}h.{layer}.attn.c_attn.weight", "conv1d"),
    ("encoder.layers.{layer}.attention.qkv.bias", "{prefix}h.{layer}.attn.c_attn.bias"),
    ("encoder.layers.{layer}.attention.out.weight", "{prefix}h.{layer}.attn.c_proj.weight", "conv1d"),
    ("encoder.layers.{layer}.attention.out.bias", "{prefix}h.{layer}.attn.c_proj.bias"),
    ("encoder.layers.{layer}.ffn_norm.{wb}", "{prefix}h.{layer}.ln_2.{wb}"),
    ("encoder.layers.{layer}.ffn.up.weight", "{prefix}h.{layer}.mlp.c_fc.weight", "conv1d"),
    ("encoder.layers.{layer}.ffn.up.bias", "{prefix}h.{layer}.mlp.c_fc.bias"),
    ("encoder.layers.{layer}.ffn.down.weight", "{prefix}h.{layer}.mlp.c_proj.weight", "conv1d"),
    ("encoder.layers.{layer}.ffn.down.bias", "{prefix}h.{layer}.mlp.c_proj.bias"),
    ("encoder.final_norm.{wb}", "{prefix}ln_f.{wb}"),
    ((), ("{prefix}h.{layer}.attn.bias?", "{prefix}h.{layer}.attn.masked_bias?"), "ignore"),
]
HEAD_TIED: list[RuleSpec] = [("embedding.word.weight", "lm_head.weight?", "tied")]
HEAD_UNTIED: list[RuleSpec] = [("targets.{lm}.output.weight", "lm_head.weight")]

DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
}
# config.json <-> pentad, in the order config.json is written. Computed by the planners: the position
# table's size, the activation's spelling, tying on import.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("n_positions"),
    Field("n_embd", "hidden_size", int),
    Field("n_layer", "encoder.num_layers", int),
    Field("n_head", "encoder.num_heads", int),
    Field("n_inner", write=lambda m: None if (m.encoder.ffn_size or 4 * m.hidden_size) == 4 * m.hidden_size
          else m.encoder.ffn_size),
    Field("activation_function"),
    Field("resid_pdrop", "encoder.dropout", float),
    Field("embd_pdrop", "embedding.dropout", float),
    Field("attn_pdrop", "encoder.attention_dropout", float,
          lambda m: float(m.encoder.attention_dropout if m.encoder.attention_dropout is not None
                          else m.encoder.dropout)),
    Field("layer_norm_epsilon", "encoder.layer_norm_eps", float),
    Field("initializer_range", "init_std", float),
    Field("scale_attn_weights", write=lambda m: True),
    Field("scale_attn_by_inverse_layer_idx", write=lambda m: False),
    Field("add_cross_attention", write=lambda m: False),
    Field("tie_word_embeddings", write=lambda m: m.tie_word_embeddings),
]
OWNED = owned_keys(FIELDS)


class GPT2Family(HFFamily):
    name = "gpt2"
    model_types = ("gpt2",)
    layout = KeyLayout(suffixes=("wte.weight",), contains=(".attn.c_attn.",))
    tokenizer_kind = "bpe"
    tokenizer_class = "GPT2Tokenizer"
    token_types = False
    default_special_tokens = {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    unsupported = ("DoubleHeadsModel", "ForSequenceClassification", "ForTokenClassification",
                   "ForQuestionAnswering")

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "causal" and positions(model) not in ("rotary", "alibi")

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("LMHeadModel") else {}

    def rules(self, *, prefix: str, num_layers: int, tied: bool, lm: str) -> list[Rule]:
        return expand(BODY + (HEAD_TIED if tied else HEAD_UNTIED), prefix=prefix, layer=range(num_layers), wb=WB,
                      lm=lm)

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = []
        bad = [a for a in config.get("architectures") or [] if isinstance(a, str) and a.endswith(self.unsupported)]
        if bad:
            problems.append(f"architecture {bad[0]} has a head pentad has no target for yet")
        act = HF_ACTIVATIONS.get(str(c["activation_function"]))
        if act is None:
            problems.append(f"activation_function '{c['activation_function']}' "
                            f"(supported: {', '.join(HF_ACTIVATIONS)})")
        if not c.get("scale_attn_weights", True) or c.get("scale_attn_by_inverse_layer_idx"):
            problems.append("attention without the 1/sqrt(head size) scale, or scaled by the layer index, is not "
                            "supported")
        if c.get("add_cross_attention"):
            problems.append("add_cross_attention (a GPT-2 decoder over an encoder) is not supported")
        if problems:
            raise UserError(f"cannot convert {label} (gpt2): " + "; ".join(problems) + ".")
        prefix = "transformer." if any(k.startswith("transformer.") for k in keys) else ""
        has_head = "lm_head.weight" in keys
        tied = bool(c.get("tie_word_embeddings", True))
        notes = []
        if not has_head and not tied:
            notes.append("GPT2Model has no lm_head: the pentad lm target uses the word embedding (tied)")
            tied = True
        hidden = int(c["n_embd"])
        positions = int(c["n_positions"])
        seq_len = max_length if max_length is not None and max_length <= positions else positions
        pos: dict[str, Any] = {"type": "pos"}
        if seq_len != positions:
            pos["max_positions"] = positions
        model = import_fields(FIELDS, c, {
            "max_seq_length": seq_len, "tie_word_embeddings": tied,
            "embedding": {"parts": [{"type": "word"}, pos], "norm": False},
            "encoder": {"type": "transformer", "ffn_size": int(c["n_inner"] or 4 * hidden), "activation": act,
                        "norm_position": "pre", "final_norm": True, "mask": "causal", "bias": True},
            "targets": [{"type": "lm", "bias": False}],
        })
        rules = self.rules(prefix=prefix, num_layers=int(c["n_layer"]), tied=tied, lm="lm")
        arch = "GPT2LMHeadModel" if has_head or prefix else "GPT2Model"
        return ImportPlan(model, rules, arch, [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        notes: list[str] = []
        parts = {p.type: p for p in model.embedding.parts}
        if set(parts) != {"word", "pos"}:
            problems.append(f"model.embedding.parts is {[p.type for p in model.embedding.parts]}; GPT-2 has word "
                            "and pos")
        if model.embedding.norm:
            problems.append("model.embedding.norm is on; GPT-2 does not normalise its embeddings")
        enc = model.encoder
        final_norm = enc.final_norm if enc.final_norm is not None else enc.norm_position == "pre"
        if enc.type != "transformer" or enc.norm_position != "pre" or not final_norm or enc.mask != "causal":
            problems.append(f"model.encoder must be a pre-norm causal transformer with a final norm (found "
                            f"{enc.type}, norm_position {enc.norm_position}, final_norm {final_norm}, mask {enc.mask})")
        if not enc.bias:
            problems.append("model.encoder.bias is off; GPT-2 layers have biases")
        problems += stack_problems(enc, "model.encoder", "gpt2", model.hidden_size)
        if model.decoder is not None or model.embedding_size not in (None, model.hidden_size):
            problems.append("GPT-2 is one causal stack without a decoder or a factorised embedding")
        act = PENTAD_ACTIVATIONS.get(enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm":
            problems.append(f"targets {[t.type for t in targets]}: GPT-2 has exactly one lm head")
        elif targets[0].bias or targets[0].scale_hidden:
            problems.append("the lm target has a bias or rescales its input; GPT-2's lm_head does neither")
        if problems:
            raise UserError(f"cannot export {label} as gpt2: " + "; ".join(problems) + ".")
        assert act is not None
        base = dict(base_config or {})
        original_act = base.get("activation_function")
        config = {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            **export_fields(FIELDS, model, n_positions=parts["pos"].max_positions or model.max_seq_length,
                            activation_function=str(original_act)
                            if HF_ACTIVATIONS.get(str(original_act)) == enc.activation else act),
        }
        if "bos_token_id" not in base and "eos_token_id" not in base:
            config["bos_token_id"] = config["eos_token_id"] = eos_id
        config = merge_config(base, OWNED, config)
        rules = self.rules(prefix="transformer.", num_layers=enc.num_layers, tied=model.tie_word_embeddings,
                           lm=targets[0].target_name)
        return ExportPlan(config, rules, "GPT2LMHeadModel", set(), notes)


FAMILY = GPT2Family()
