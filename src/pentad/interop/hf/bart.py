"""BART (``model_type: bart``): key map and config translation, both ways; Pegasus (:mod:`.pegasus`)
shares the layout.

``BartForConditionalGeneration`` (and a bare ``BartModel``) becomes a pentad encoder-decoder with
one shared word table, learned positions and a LayerNorm on each embedding, post-norm layers with
biases, and an ``lm`` target tied to the word table whose bias is ``final_logits_bias``. The export
always writes ``BartForConditionalGeneration``.

**Position offset.** BART's ``embed_positions`` tables have ``max_position_embeddings + 2`` rows
and position p reads row p + 2 (a fairseq leftover; rows 0 and 1 are never read). pentad's ``pos``
parts hold rows 2.. (``max_positions`` = ``max_position_embeddings``); rows 0 and 1 of each table
go to ``interop_extra.safetensors`` for the way back (zeros for a model trained in pentad).
Positions count from 0 whatever the padding, so they agree with pentad's for any batch.

``final_logits_bias`` is a [1, V] buffer, pentad's ``lm.output.bias`` [V]. ``scale_embedding``
multiplies the word embedding by sqrt(d_model) (pentad ``word.scale``). BART's ``activation_dropout``
(inside the feed-forward) has no pentad counterpart; it only matters in training.
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
    activation,
    activation_name,
    encoder_decoder_problems,
    export_fields,
    hinted_problems,
    import_fields,
    merge_config,
    owned_keys,
    part_types,
    positions,
    seq_length,
    text_kind,
)
from pentad.interop.keymap import WB, Rule, RuleSpec, expand

# {p}: "model." inside BartForConditionalGeneration, "" for a bare BartModel checkpoint.
SHARED: list[RuleSpec] = [
    ("embedding.word.weight", "{p}shared.weight"),
    ("embedding.word.weight", "{p}encoder.embed_tokens.weight?", "tied"),
    ("embedding.word.weight", "{p}decoder.embed_tokens.weight?", "tied"),
]
LEARNED_POSITIONS: list[RuleSpec] = [
    ("embedding.pos.weight", "{p}encoder.embed_positions.weight", "leading_rows:2"),
    ("target_embedding.pos.weight", "{p}decoder.embed_positions.weight", "leading_rows:2"),
]
EMBEDDING_NORMS: list[RuleSpec] = [
    ("embedding.norm.{wb}", "{p}encoder.layernorm_embedding.{wb}"),
    ("target_embedding.norm.{wb}", "{p}decoder.layernorm_embedding.{wb}"),
]
# {s}: "encoder" or "decoder".
SELF_ATTENTION: list[RuleSpec] = [
    ("{s}.layers.{layer}.attention.qkv.{wb}",
     ("{p}{s}.layers.{layer}.self_attn.q_proj.{wb}", "{p}{s}.layers.{layer}.self_attn.k_proj.{wb}",
      "{p}{s}.layers.{layer}.self_attn.v_proj.{wb}"), "fuse_qkv"),
    ("{s}.layers.{layer}.attention.out.{wb}", "{p}{s}.layers.{layer}.self_attn.out_proj.{wb}"),
    ("{s}.layers.{layer}.attention_norm.{wb}", "{p}{s}.layers.{layer}.self_attn_layer_norm.{wb}"),
    ("{s}.layers.{layer}.ffn.up.{wb}", "{p}{s}.layers.{layer}.fc1.{wb}"),
    ("{s}.layers.{layer}.ffn.down.{wb}", "{p}{s}.layers.{layer}.fc2.{wb}"),
    ("{s}.layers.{layer}.ffn_norm.{wb}", "{p}{s}.layers.{layer}.final_layer_norm.{wb}"),
]
CROSS_ATTENTION: list[RuleSpec] = [
    ("decoder.layers.{layer}.cross_attention.q.{wb}", "{p}decoder.layers.{layer}.encoder_attn.q_proj.{wb}"),
    ("decoder.layers.{layer}.cross_attention.kv.{wb}",
     ("{p}decoder.layers.{layer}.encoder_attn.k_proj.{wb}", "{p}decoder.layers.{layer}.encoder_attn.v_proj.{wb}"),
     "fuse_kv"),
    ("decoder.layers.{layer}.cross_attention.out.{wb}", "{p}decoder.layers.{layer}.encoder_attn.out_proj.{wb}"),
    ("decoder.layers.{layer}.cross_attention_norm.{wb}", "{p}decoder.layers.{layer}.encoder_attn_layer_norm.{wb}"),
]
FINAL_NORMS: list[RuleSpec] = [
    ("encoder.final_norm.{wb}", "{p}encoder.layer_norm.{wb}"),
    ("decoder.final_norm.{wb}", "{p}decoder.layer_norm.{wb}"),
]
HEAD: list[RuleSpec] = [
    ("embedding.word.weight", "lm_head.weight?", "tied"),
    ("targets.{lm}.output.bias", "final_logits_bias", "row_vector"),
]

# BartConfig's defaults.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265, "max_position_embeddings": 1024, "encoder_layers": 12, "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16, "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "d_model": 1024, "dropout": 0.1, "attention_dropout": 0.0,
    "activation_dropout": 0.0, "init_std": 0.02, "scale_embedding": False, "pad_token_id": 1,
    "tie_word_embeddings": True,
}
# config.json <-> pentad, in the order config.json is written (Pegasus's too). Computed by the planners:
# the position tables' size, the activation, the word scale; the dropouts are the encoder's and decoder's.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("max_position_embeddings"),
    Field("d_model", "hidden_size", int),
    Field("encoder_layers", "encoder.num_layers", int),
    Field("encoder_ffn_dim", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("encoder_attention_heads", "encoder.num_heads", int),
    Field("decoder_layers", "decoder.num_layers", int),
    Field("decoder_ffn_dim", "decoder.ffn_size", int, lambda m: m.decoder.ffn_size or 4 * m.hidden_size),
    Field("decoder_attention_heads", "decoder.num_heads", int),
    Field("activation_function"),
    Field("dropout", write=lambda m: float(m.encoder.dropout)),
    Field("attention_dropout", write=lambda m: float(m.encoder.attention_dropout
                                                     if m.encoder.attention_dropout is not None
                                                     else m.encoder.dropout)),
    Field("init_std", "init_std", float),
    Field("scale_embedding"),
    Field("tie_word_embeddings", write=lambda m: True),
    Field("is_encoder_decoder", write=lambda m: True),
]
OWNED = owned_keys(FIELDS)
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which BART and Pegasus use everywhere


class BartLikeFamily(HFFamily):
    """BART, and Pegasus (sinusoidal positions, pre-norm with final norms, no embedding norm)."""

    name = "bart"
    # PEGASUS's names and an embedding norm: tried before PEGASUS
    layout = KeyLayout(contains=("encoder_attn.q_proj",), also=("layernorm_embedding",), rank=40)
    model_types: tuple[str, ...] = ("bart",)
    class_prefix = "Bart"
    defaults = DEFAULTS
    owned = OWNED
    tokenizer_kind: str | None = "bpe"
    tokenizer_class = "BartTokenizer"
    default_special_tokens = {"bos": "<s>", "cls": "<s>", "eos": "</s>", "sep": "</s>", "pad": "<pad>",
                              "unk": "<unk>", "mask": "<mask>"}
    token_types = False
    pre_norm = False  # Pegasus: True (pre-norm layers and a final norm per stack, no embedding norm)

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder_decoder" and positions(model) != "relative" \
            and "sinusoidal" not in part_types(model)

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForConditionalGeneration") else {}

    def position_rules(self, positions: int, hidden: int) -> list[RuleSpec]:
        return LEARNED_POSITIONS

    def rules(self, *, prefix: str, encoder_layers: int, decoder_layers: int, positions: int, hidden: int,
              lm: str, head: bool) -> list[Rule]:
        extra = FINAL_NORMS if self.pre_norm else EMBEDDING_NORMS
        rules = expand(SHARED + self.position_rules(positions, hidden) + extra + (HEAD if head else []),
                       p=prefix, wb=WB, lm=lm)
        rules += expand(SELF_ATTENTION, p=prefix, s="encoder", layer=range(encoder_layers), wb=WB)
        rules += expand(SELF_ATTENTION + CROSS_ATTENTION, p=prefix, s="decoder", layer=range(decoder_layers), wb=WB)
        return rules

    def embedding_parts(self, c: dict[str, Any], positions: int) -> list[dict[str, Any]]:
        return [{"type": "word", "scale": bool(c["scale_embedding"])}, {"type": "pos", "max_positions": positions}]

    # -- import -----------------------------------------------------------------------------------
    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**self.defaults, **config}
        cls = self.class_prefix
        problems = hinted_problems(config, (f"{cls}ForConditionalGeneration", f"{cls}Model"))
        act = activation(c["activation_function"], problems, "activation_function")
        if not c.get("tie_word_embeddings", True):
            problems.append("tie_word_embeddings false (separate encoder, decoder and output tables): pentad converts "
                            f"{cls} with its one shared table")
        if not self.pre_norm and any(k.endswith("encoder.layer_norm.weight") for k in keys):
            problems.append("a final layer norm per stack (an mBART checkpoint?) is not BART's layout")
        if problems:
            raise UserError(f"cannot convert {label} ({self.name}): " + "; ".join(problems) + ".")
        prefix = "model." if any(k.startswith("model.") for k in keys) else ""
        head = "final_logits_bias" in keys
        hidden, positions = int(c["d_model"]), int(c["max_position_embeddings"])
        dropout = float(c["dropout"])
        stack = {"type": "transformer", "activation": act, "norm_position": "pre" if self.pre_norm else "post",
                 "final_norm": self.pre_norm, "dropout": dropout, "attention_dropout": float(c["attention_dropout"]),
                 "bias": True, "layer_norm_eps": LAYER_NORM_EPS}
        embedding = {"parts": self.embedding_parts(c, positions), "norm": not self.pre_norm,
                     "layer_norm_eps": LAYER_NORM_EPS, "dropout": dropout}
        model = import_fields(FIELDS, c, {
            "max_seq_length": seq_length(max_length, positions), "tie_word_embeddings": True,
            "share_embedding": True, "embedding": embedding, "target_embedding": embedding,
            "encoder": {**stack, "mask": "bidirectional"}, "decoder": dict(stack),
            "targets": [{"type": "lm", "bias": True}],
        })
        notes: list[str] = []
        synthesized: list[str] = []
        if not head:
            synthesized = ["targets.lm.output.bias"]
            notes.append("targets.lm.output.bias: no final_logits_bias in the checkpoint; zeros, as transformers "
                         "starts it")
        if float(c.get("activation_dropout", 0.0)):
            notes.append(f"activation_dropout {c['activation_dropout']} has no pentad counterpart (training only)")
        notes += self.position_notes(positions)
        arch = f"{cls}ForConditionalGeneration" if head else f"{cls}Model"
        rules = self.rules(prefix=prefix, encoder_layers=int(c["encoder_layers"]),
                           decoder_layers=int(c["decoder_layers"]), positions=positions, hidden=hidden, lm="lm",
                           head=head)
        return ImportPlan(model, rules, arch, synthesized, notes)

    def position_notes(self, positions: int) -> list[str]:
        return [f"position tables: HF rows 2..{positions + 1} are pentad positions 0..{positions - 1}; HF rows 0 and "
                "1 (never read) are kept in interop_extra.safetensors for the way back"]

    # -- export -----------------------------------------------------------------------------------
    def embedding_problems(self, slot: Any, path: str) -> tuple[list[str], int | None, bool]:
        """(problems, position-table size, scaled word embedding) of one embedding slot."""
        parts = [p.type for p in slot.parts]
        problems = []
        if parts != ["word", "pos"]:
            problems.append(f"{path}.parts is {parts}; {self.name} has word and pos")
        if not slot.norm:
            problems.append(f"{path}.norm is off; {self.name} normalises its embeddings")
        elif float(slot.layer_norm_eps) != LAYER_NORM_EPS:
            problems.append(f"{path}.layer_norm_eps {slot.layer_norm_eps}; {self.name} uses {LAYER_NORM_EPS}")
        pos = next((p for p in slot.parts if p.type == "pos"), None)
        return problems, (pos.max_positions if pos is not None else None), bool(getattr(slot.parts[0], "scale", False))

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc, dec = model.encoder, model.decoder
        if dec is None or model.target_embedding is None:
            raise UserError(f"cannot export {label} as {self.name}: it has no decoder ({self.name} is an "
                            "encoder-decoder).")
        found = [self.embedding_problems(model.embedding, "model.embedding"),
                 self.embedding_problems(model.target_embedding, "model.target_embedding")]
        for p, _, _ in found:
            problems += p
        positions = {f[1] or model.max_seq_length for f in found}
        scales = {f[2] for f in found}
        if len(positions) > 1 or len(scales) > 1:
            problems.append(f"the encoder and decoder embeddings differ (positions {sorted(positions)}, word scale "
                            f"{sorted(scales)}); {self.name} has one value for both")
        if not model.share_embedding or model.target_vocab_size not in (None, model.vocab_size):
            problems.append(f"{self.name} shares one word table between encoder and decoder (share_embedding: true)")
        if not model.tie_word_embeddings:
            problems.append(f"{self.name}'s output layer is the word table (tie_word_embeddings: true)")
        if model.embedding_size not in (None, model.hidden_size):
            problems.append(f"model.embedding_size {model.embedding_size} ({self.name} has no factorised embedding)")
        problems += encoder_decoder_problems(enc, dec, self.name, model.hidden_size, pre_norm=self.pre_norm,
                                             layer_norm_eps=LAYER_NORM_EPS)
        if getattr(enc, "mask", "bidirectional") != "bidirectional":
            problems.append(f"model.encoder.mask is {enc.mask}; the {self.name} encoder is bidirectional")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or not targets[0].bias or targets[0].scale_hidden:
            problems.append(f"targets {[t.type for t in targets]}: {self.name} has one lm head with a bias "
                            "(final_logits_bias) and no rescaling")
        base = dict(base_config or {})
        act = activation_name(base.get("activation_function"), enc.activation)
        if act is None:
            problems.append(f"activation '{enc.activation}' has no HF name")
        if problems:
            raise UserError(f"cannot export {label} as {self.name}: " + "; ".join(problems) + ".")
        size = positions.pop()
        cls = self.class_prefix
        config = {
            "architectures": [f"{cls}ForConditionalGeneration"], "model_type": self.model_types[0],
            **export_fields(FIELDS, model, max_position_embeddings=size, activation_function=act,
                            scale_embedding=scales.pop()),
        }
        for key, value in (("pad_token_id", pad_id), ("eos_token_id", eos_id)):
            if key not in base and value is not None:
                config[key] = value
        notes: list[str] = []
        config = merge_config(base, self.owned, config)
        rules = self.rules(prefix="model.", encoder_layers=enc.num_layers, decoder_layers=dec.num_layers,
                           positions=size, hidden=model.hidden_size, lm=targets[0].target_name, head=True)
        return ExportPlan(config, rules, f"{cls}ForConditionalGeneration", set(), notes)


FAMILY = BartLikeFamily()
