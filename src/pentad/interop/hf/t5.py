"""T5 (``model_type: t5``): v1.0 and v1.1 encoder-decoders, key map and config, both ways.

``T5ForConditionalGeneration`` (and a bare ``T5Model``, whose output layer is the shared embedding)
becomes a pentad encoder-decoder: one shared word table (``share_embedding``), pre-norm layers with
T5's RMS "layer norm" and no biases, unscaled attention (T5 folds 1/sqrt(d) into its
initialisation), a bucketed relative position bias owned by the first layer of each stack (pentad:
``encoder.relative_bias`` / ``decoder.relative_bias``, the decoder's one-directional), and an ``lm``
target. The export always writes ``T5ForConditionalGeneration``.

* **v1.0** (``feed_forward_proj: relu``): dense feed-forward; the output layer is the word table,
  and the decoder output is multiplied by d_model^-0.5 first (pentad ``lm.scale_hidden``).
* **v1.1** (``gated-gelu``): gated feed-forward ``wo(gelu_tanh(wi_0 x) * wi_1 x)`` (pentad ``ffn.gate``
  = ``wi_0``, ``ffn.up`` = ``wi_1``), an output layer of its own and no rescaling.

Hugging Face ``transformers`` 5 always ties ``lm_head`` to the shared table when it builds a T5 from
a config, and keeps them apart when a checkpoint holds two different tensors; it rescales the
decoder output when ``scale_decoder_outputs`` is true (older configs: ``tie_word_embeddings``).
The import ties pentad's output layer when the checkpoint has no ``lm_head.weight`` (or an old one
that says it is tied); the export writes ``tie_word_embeddings`` and ``scale_decoder_outputs`` both
equal to the rescaling, and ``lm_head.weight`` whenever that is false, so older and newer
``transformers`` read it the same way.
"""

from __future__ import annotations

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
from pentad.interop.keymap import Rule, RuleSpec, expand

# {s}: "encoder" or "decoder"; {block}: that stack's layer prefix in HF.
SHARED: list[RuleSpec] = [
    ("embedding.word.weight", "shared.weight"),
    ("embedding.word.weight", "encoder.embed_tokens.weight?", "tied"),
    ("embedding.word.weight", "decoder.embed_tokens.weight?", "tied"),
]
SELF_ATTENTION: list[RuleSpec] = [
    ("{s}.layers.{layer}.attention.qkv.weight",
     ("{s}.block.{layer}.layer.0.SelfAttention.q.weight", "{s}.block.{layer}.layer.0.SelfAttention.k.weight",
      "{s}.block.{layer}.layer.0.SelfAttention.v.weight"), "fuse_qkv"),
    ("{s}.layers.{layer}.attention.out.weight", "{s}.block.{layer}.layer.0.SelfAttention.o.weight"),
    ("{s}.layers.{layer}.attention_norm.weight", "{s}.block.{layer}.layer.0.layer_norm.weight"),
]
CROSS_ATTENTION: list[RuleSpec] = [
    ("decoder.layers.{layer}.cross_attention.q.weight", "decoder.block.{layer}.layer.1.EncDecAttention.q.weight"),
    ("decoder.layers.{layer}.cross_attention.kv.weight",
     ("decoder.block.{layer}.layer.1.EncDecAttention.k.weight",
      "decoder.block.{layer}.layer.1.EncDecAttention.v.weight"), "fuse_kv"),
    ("decoder.layers.{layer}.cross_attention.out.weight", "decoder.block.{layer}.layer.1.EncDecAttention.o.weight"),
    ("decoder.layers.{layer}.cross_attention_norm.weight", "decoder.block.{layer}.layer.1.layer_norm.weight"),
]
# {ff}: the index of the feed-forward sub-layer (1 in the encoder, 2 in the decoder).
DENSE_FFN: list[RuleSpec] = [
    ("{s}.layers.{layer}.ffn.up.weight", "{s}.block.{layer}.layer.{ff}.DenseReluDense.wi.weight"),
    ("{s}.layers.{layer}.ffn.down.weight", "{s}.block.{layer}.layer.{ff}.DenseReluDense.wo.weight"),
    ("{s}.layers.{layer}.ffn_norm.weight", "{s}.block.{layer}.layer.{ff}.layer_norm.weight"),
]
GATED_FFN: list[RuleSpec] = [
    ("{s}.layers.{layer}.ffn.gate.weight", "{s}.block.{layer}.layer.{ff}.DenseReluDense.wi_0.weight"),
    ("{s}.layers.{layer}.ffn.up.weight", "{s}.block.{layer}.layer.{ff}.DenseReluDense.wi_1.weight"),
    ("{s}.layers.{layer}.ffn.down.weight", "{s}.block.{layer}.layer.{ff}.DenseReluDense.wo.weight"),
    ("{s}.layers.{layer}.ffn_norm.weight", "{s}.block.{layer}.layer.{ff}.layer_norm.weight"),
]
STACK_END: list[RuleSpec] = [
    ("{s}.relative_bias.weight", "{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    ("{s}.final_norm.weight", "{s}.final_layer_norm.weight"),
]
HEADS: dict[str, list[RuleSpec]] = {
    "tied": [("embedding.word.weight", "lm_head.weight?", "tied")],
    # tied but unscaled: transformers must see lm_head.weight to keep the two apart (see above)
    "tied-written": [("embedding.word.weight", "lm_head.weight", "tied")],
    "untied": [("targets.{lm}.output.weight", "lm_head.weight")],
}

# T5Config's defaults.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": None,
    "num_heads": 8, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0, "feed_forward_proj": "relu",
    "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": True,
}
# config.json <-> pentad, in the order config.json is written; the encoder's rows are the decoder's too.
# Computed by the planners: the feed-forward's spelling, the output layer's scaling and tying, the
# decoder's depth on import, the special token ids.
FIELDS: list[Field] = [
    Field("vocab_size", "vocab_size", int),
    Field("d_model", "hidden_size", int),
    Field("d_kv", write=lambda m: m.encoder.head_size or m.hidden_size // m.encoder.num_heads),
    Field("d_ff", "encoder.ffn_size", int, lambda m: m.encoder.ffn_size or 4 * m.hidden_size),
    Field("num_layers", "encoder.num_layers", int),
    Field("num_decoder_layers", write=lambda m: m.decoder.num_layers),
    Field("num_heads", "encoder.num_heads", int),
    Field("relative_attention_num_buckets", "encoder.relative_buckets", int),
    Field("relative_attention_max_distance", "encoder.relative_max_distance", int),
    Field("dropout_rate", "encoder.dropout", float),
    Field("layer_norm_epsilon", "encoder.layer_norm_eps", float),
    Field("feed_forward_proj"),
    Field("is_encoder_decoder", write=lambda m: True),
    Field("tie_word_embeddings"),
    Field("scale_decoder_outputs"),
]
# what transformers derives from feed_forward_proj, and the decoder flag, are not kept from an imported config
OWNED = owned_keys(FIELDS, "dense_act_fn", "is_gated_act", "is_decoder")
SUPPORTED = ("T5ForConditionalGeneration", "T5Model")


def feed_forward(proj: str) -> tuple[bool, str] | None:
    """(gated, pentad activation) of a ``feed_forward_proj`` ("relu", "gated-gelu", ...)."""
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        return None
    name = "gelu_new" if proj == "gated-gelu" else parts[-1]  # HF's historical special case
    act = HF_ACTIVATIONS.get(name)
    return (len(parts) == 2, act) if act is not None else None


class T5Family(HFFamily):
    name = "t5"
    model_types = ("t5",)
    layout = KeyLayout(contains=(".SelfAttention.q.",), prefixes=("encoder.block.",))
    tokenizer_kind = "sentencepiece"
    tokenizer_class = "T5Tokenizer"
    spm_files = ("spiece.model",)
    spm_layout = "t5"
    default_special_tokens = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}
    token_types = False

    def describes(self, model: Any) -> bool:
        return text_kind(model) == "encoder_decoder" and positions(model) == "relative" and not mixture(model)

    def outputs(self, architecture: str) -> dict[str, str]:
        return {"lm": "logits"} if architecture.endswith("ForConditionalGeneration") else {}

    def rules(self, *, encoder_layers: int, decoder_layers: int, gated: bool, head: str, lm: str) -> list[Rule]:
        """head: "tied", "tied-written" or "untied" (see ``HEADS``)."""
        ffn = GATED_FFN if gated else DENSE_FFN
        rules = expand(SHARED + HEADS[head], lm=lm)
        rules += expand(SELF_ATTENTION + ffn, s="encoder", layer=range(encoder_layers), ff="1")
        rules += expand(STACK_END, s="encoder")
        rules += expand(SELF_ATTENTION + CROSS_ATTENTION + ffn, s="decoder", layer=range(decoder_layers), ff="2")
        rules += expand(STACK_END, s="decoder")
        return rules

    def plan_import(self, config: dict[str, Any], keys: dict[str, tuple[int, ...]], label: str,
                    max_length: int | None) -> ImportPlan:
        c = {**DEFAULTS, **config}
        problems = hinted_problems(config, SUPPORTED)
        ffn = feed_forward(str(c["feed_forward_proj"]))
        if ffn is None:
            problems.append(f"feed_forward_proj '{c['feed_forward_proj']}' (supported: an activation such as relu, "
                            "or gated-<activation>)")
        if not c.get("is_encoder_decoder", True) or c.get("is_decoder"):
            problems.append("only the encoder-decoder T5 converts (is_encoder_decoder true)")
        if "shared.weight" not in keys and any(k.startswith("encoder.block.") for k in keys):
            problems.append("the checkpoint has no shared.weight (a T5EncoderModel, which has no decoder)")
        if problems:
            raise UserError(f"cannot convert {label} (t5): " + "; ".join(problems) + ".")
        assert ffn is not None
        gated, act = ffn
        hidden, heads, head = int(c["d_model"]), int(c["num_heads"]), int(c["d_kv"])
        # Older configs say tie_word_embeddings where transformers 5 says scale_decoder_outputs.
        scale = bool(c["scale_decoder_outputs"] if "scale_decoder_outputs" in c else c.get("tie_word_embeddings", True))
        has_head = "lm_head.weight" in keys
        tied = not has_head or ("scale_decoder_outputs" not in config and bool(c.get("tie_word_embeddings", True)))
        dropout = float(c["dropout_rate"])
        decoder_layers = int(c["num_decoder_layers"] if c.get("num_decoder_layers") is not None else c["num_layers"])
        embedding = {"parts": [{"type": "word"}], "norm": False, "dropout": dropout}
        model = import_fields(FIELDS, c, {
            "max_seq_length": seq_length(max_length, None), "tie_word_embeddings": tied, "share_embedding": True,
            "embedding": embedding, "target_embedding": dict(embedding),
            "encoder": {"type": "transformer", "ffn": "gated" if gated else "dense", "activation": act, "norm": "t5",
                        "norm_position": "pre", "final_norm": True, "attention_dropout": dropout, "bias": False,
                        "attention_scale": False, "positions": "relative"},
            "targets": [{"type": "lm", "scale_hidden": scale}],
        })
        stack = model["encoder"]
        if head * heads != hidden:
            stack["head_size"] = head
        model["decoder"] = {**stack, "num_layers": decoder_layers}
        stack["mask"] = "bidirectional"
        notes = []
        if not has_head:
            notes.append("the output layer is the shared word table (no lm_head.weight in the checkpoint)")
        arch = "T5ForConditionalGeneration" if has_head or "T5Model" not in (config.get("architectures") or []) \
            else "T5Model"
        rules = self.rules(encoder_layers=stack["num_layers"], decoder_layers=decoder_layers, gated=gated,
                           head="tied" if tied else "untied", lm="lm")
        return ImportPlan(model, rules, arch, [], notes)

    def plan_export(self, model: Any, *, label: str, model_type: str | None, base_config: dict[str, Any] | None,
                    omittable: set[str], pad_id: int | None, eos_id: int | None,
                    labels: list[str] | None) -> ExportPlan:
        problems: list[str] = []
        enc, dec = model.encoder, model.decoder
        if dec is None or model.target_embedding is None:
            raise UserError(f"cannot export {label} as t5: it has no decoder (T5 is an encoder-decoder).")
        for path, slot in (("model.embedding", model.embedding), ("model.target_embedding", model.target_embedding)):
            if [p.type for p in slot.parts] != ["word"] or slot.norm or getattr(slot.parts[0], "scale", False):
                problems.append(f"{path} must be an unscaled word table alone without a norm (T5 has no absolute "
                                "positions)")
        if not model.share_embedding or (model.target_vocab_size not in (None, model.vocab_size)):
            problems.append("T5 shares one word table between encoder and decoder (share_embedding: true)")
        if model.embedding_size not in (None, model.hidden_size):
            problems.append(f"model.embedding_size {model.embedding_size} (T5 has no factorised embedding)")
        fields = ("num_heads", "num_kv_heads", "head_size", "ffn_size", "ffn", "activation", "layer_norm_eps",
                  "relative_buckets", "relative_max_distance", "dropout")
        for f in fields:
            if getattr(enc, f) != getattr(dec, f):
                problems.append(f"model.encoder.{f} ({getattr(enc, f)}) and model.decoder.{f} ({getattr(dec, f)}) "
                                "differ; T5 has one value for both")
        for path, stack in (("model.encoder", enc), ("model.decoder", dec)):
            final = stack.final_norm if stack.final_norm is not None else stack.norm_position == "pre"
            if stack.norm not in ("t5", "rmsnorm") or stack.norm_position != "pre" or not final or stack.bias:
                problems.append(f"{path} must be pre-norm with T5's RMS norm, a final norm and no biases")
            problems += stack_problems(stack, path, "t5", model.hidden_size, head_size=True, norm=stack.norm,
                                       ffn=stack.ffn, attention_scale=False, positions="relative")
        if getattr(enc, "mask", "bidirectional") != "bidirectional":
            problems.append(f"model.encoder.mask is {enc.mask}; T5's encoder is bidirectional")
        targets = list(model.targets)
        if len(targets) != 1 or targets[0].type != "lm" or targets[0].bias:
            problems.append(f"targets {[t.type for t in targets]}: T5 has one lm head without a bias")
        base = dict(base_config or {})
        proj = _feed_forward_name(base.get("feed_forward_proj"), enc.ffn == "gated", enc.activation)
        if proj is None:
            problems.append(f"a {enc.ffn} feed-forward with {enc.activation} has no T5 feed_forward_proj")
        if problems:
            raise UserError(f"cannot export {label} as t5: " + "; ".join(problems) + ".")
        scale = bool(targets[0].scale_hidden)
        pad = pad_id if pad_id is not None else int(base.get("pad_token_id", 0) or 0)
        config = {
            "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            **export_fields(FIELDS, model, feed_forward_proj=proj, tie_word_embeddings=scale,
                            scale_decoder_outputs=scale),
            "pad_token_id": pad, "eos_token_id": eos_id if eos_id is not None else base.get("eos_token_id", 1),
        }
        if not base:  # a model trained in pentad: T5 starts decoding from the padding id
            config["decoder_start_token_id"] = pad
        notes = []
        if model.tie_word_embeddings and not scale:
            notes.append("the output layer is tied but unscaled (as TencentPretrain's T5): written as lm_head.weight, "
                         "which transformers keeps tied")
        config = merge_config(base, OWNED, config)
        head = ("tied" if scale else "tied-written") if model.tie_word_embeddings else "untied"
        rules = self.rules(encoder_layers=enc.num_layers, decoder_layers=dec.num_layers, gated=enc.ffn == "gated",
                           head=head, lm=targets[0].target_name)
        return ExportPlan(config, rules, "T5ForConditionalGeneration", set(), notes)


def _feed_forward_name(original: Any, gated: bool, act: str) -> str | None:
    """T5's feed_forward_proj for a pentad feed-forward: the imported spelling when it means the
    same, else ``relu`` / ``gated-gelu`` / ``gated-silu`` ..."""
    if isinstance(original, str) and feed_forward(original) == (gated, act):
        return original
    if gated and act == "gelu_tanh":
        return "gated-gelu"  # T5 v1.1's name (HF reads it as the tanh approximation)
    name = activation_name(None, act)
    if name is None or (gated and act == "gelu"):
        return None  # gated exact GELU: "gated-gelu" means the tanh approximation in HF
    return f"gated-{name}" if gated else name


FAMILY = T5Family()
